// The process's resident memory as /proc/self/status reports it: touching 64 MiB shows in the
// current and the peak figure, and freeing it lowers the current one but never the peak.
#include "common/process_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

namespace tidal {
namespace {

// Pages straight from the kernel and back, so what the counters see does not depend on the
// allocator (AddressSanitizer's keeps freed blocks in quarantine).
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Mapping() { Unmap(); }
  char* data() const { return data_; }
  void Unmap() {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
  }

 private:
  size_t bytes_;
  char* data_;
};

TEST(ProcessMemoryTest, TouchedPagesRaiseResidentAndPeakAndFreeingKeepsThePeak) {
  auto before = ReadProcessMemory();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->rss_bytes, 0);
  EXPECT_GE(before->peak_rss_bytes, before->rss_bytes);
  constexpr int64_t kBytes = 64 << 20;
  Mapping block(kBytes);
  ASSERT_NE(block.data(), nullptr);
  std::memset(block.data(), 1, kBytes);  // resident only once written
  auto during = ReadProcessMemory();
  ASSERT_TRUE(during.has_value());
  EXPECT_GE(during->rss_bytes, before->rss_bytes + kBytes * 9 / 10);
  EXPECT_GE(during->peak_rss_bytes, before->rss_bytes + kBytes * 9 / 10);
  EXPECT_EQ(block.data()[kBytes - 1], 1);
  block.Unmap();
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
    Mapping block(kBytes);
    ASSERT_NE(block.data(), nullptr);
    std::memset(block.data(), 1, kBytes);
    EXPECT_EQ(block.data()[0], 1);
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
