// The process's resident memory as /proc/self/status reports it: touching 64 MiB shows in the
// current and the peak figure, and freeing it lowers the current one but never the peak.
#include "common/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace tidal {
namespace {

TEST(ProcessMemoryTest, TouchedPagesRaiseResidentAndPeakAndFreeingKeepsThePeak) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine";
#endif
  auto before = ReadProcessMemory();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->rss_bytes, 0);
  EXPECT_GE(before->peak_rss_bytes, before->rss_bytes);
  constexpr int64_t kBytes = 64 << 20;
  auto block = std::make_unique<char[]>(kBytes);
  std::memset(block.get(), 1, kBytes);  // resident only once written
  auto during = ReadProcessMemory();
  ASSERT_TRUE(during.has_value());
  EXPECT_GE(during->rss_bytes, before->rss_bytes + kBytes * 9 / 10);
  EXPECT_GE(during->peak_rss_bytes, before->rss_bytes + kBytes * 9 / 10);
  EXPECT_EQ(block[kBytes - 1], 1);
  block.reset();  // a block this large is mmapped by malloc, so freeing unmaps it
  auto after = ReadProcessMemory();
  ASSERT_TRUE(after.has_value());
  EXPECT_LE(after->rss_bytes, during->rss_bytes - kBytes * 9 / 10);
  // (The kernel's counters are batched per thread: the peak can read a few pages apart.)
  EXPECT_GE(after->peak_rss_bytes, before->rss_bytes + kBytes * 9 / 10);
}

// After a reset the peak is today's size again: a 64 MiB block touched and freed before it no
// longer shows, so a phase's peak is its own.
TEST(ProcessMemoryTest, ResetStartsThePeakOverFromTheCurrentSize) {
  {
    constexpr int64_t kBytes = 64 << 20;
    auto block = std::make_unique<char[]>(kBytes);
    std::memset(block.get(), 1, kBytes);
    EXPECT_EQ(block[0], 1);
  }
  auto before = ReadProcessMemory();
  ASSERT_TRUE(before.has_value());
  if (!ResetPeakRss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  auto after = ReadProcessMemory();
  ASSERT_TRUE(after.has_value());
  EXPECT_LE(after->peak_rss_bytes, before->peak_rss_bytes - (60 << 20));
  EXPECT_GE(after->peak_rss_bytes, after->rss_bytes);
}

}  // namespace
}  // namespace tidal
