// The process's resident memory as /proc/self/status reports it: touching 64 MiB shows in the
// current and the peak figure, and freeing it lowers the current one but never the peak.
#include "worker/engine/process_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

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

// A /proc and /sys/fs/cgroup of our making, under a temporary root.
class FakeHost {
 public:
  FakeHost() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tidal-host-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
  }
  ~FakeHost() { std::filesystem::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(root_ + path).parent_path());
    std::ofstream(root_ + path) << text;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

constexpr const char* kMeminfo =
    "MemTotal:       24683656 kB\nMemFree:        1000000 kB\nMemAvailable:    8000000 kB\n";
constexpr int64_t kAvailable = int64_t{8000000} * 1024;

TEST(MemoryHeadroomTest, TheHostsFigureIsMemAvailableAndNoLimitIsNoCgroupFigure) {
  FakeHost host;
  host.Write("/proc/meminfo", kMeminfo);
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).host, kAvailable);
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).cgroup, std::nullopt);
  // v2 "max" and v1's near-2^63 both say no limit.
  host.Write("/proc/self/cgroup", "0::/kubepods/pod1\n4:memory:/kubepods/pod1\n");
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "max\n");
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.current", "1000\n");
  host.Write("/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes", "9223372036854771712\n");
  host.Write("/sys/fs/cgroup/memory/kubepods/pod1/memory.usage_in_bytes", "1000\n");
  const MemoryHeadroom got = ReadMemoryHeadroom(host.root());
  EXPECT_EQ(got.host, kAvailable);
  EXPECT_EQ(got.cgroup, std::nullopt);
}

// The pod's limit less its usage, where the inactive page cache (a model's files read, the
// checkpoints written) is not counted as used: the kernel reclaims it first.
TEST(MemoryHeadroomTest, ACgroupV2LimitLeavesItLessTheUsageWithoutTheInactivePageCache) {
  FakeHost host;
  host.Write("/proc/meminfo", kMeminfo);
  host.Write("/proc/self/cgroup", "0::/kubepods/pod1\n");
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "4294967296\n");
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.current", "3221225472\n");
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).cgroup, int64_t{1} << 30);
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.stat",
             "anon 1073741824\nfile 2147483648\nactive_file 1073741824\n"
             "inactive_file 1073741824\n");
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).cgroup, int64_t{2} << 30);
  // A pod over its limit (the kernel is reclaiming) has none left, not a negative.
  host.Write("/sys/fs/cgroup/kubepods/pod1/memory.current", "6000000000\n");
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).cgroup, 0);
  EXPECT_EQ(ReadMemoryHeadroom(host.root()).host, kAvailable);
}

// Without a cgroup namespace, /proc/self/cgroup names the host's path while the container's
// own cgroup is mounted at the mount's root; under v1 the memory controller may share its
// hierarchy with others.
TEST(MemoryHeadroomTest, WhereTheHostsPathIsAbsentTheMountRootIsThePods) {
  FakeHost v1;
  v1.Write("/proc/self/cgroup", "5:cpu,cpuacct:/kubepods/pod1\n4:hugetlb,memory:/kubepods/pod1\n");
  v1.Write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "2147483648\n");
  v1.Write("/sys/fs/cgroup/memory/memory.usage_in_bytes", "1610612736\n");
  v1.Write("/sys/fs/cgroup/memory/memory.stat", "cache 9\ntotal_inactive_file 536870912\n");
  EXPECT_EQ(ReadMemoryHeadroom(v1.root()).cgroup, int64_t{1} << 30);
  FakeHost v2;
  v2.Write("/proc/self/cgroup", "0::/kubepods/pod1\n");
  v2.Write("/sys/fs/cgroup/memory.max", "2147483648\n");
  v2.Write("/sys/fs/cgroup/memory.current", "1073741824\n");
  EXPECT_EQ(ReadMemoryHeadroom(v2.root()).cgroup, int64_t{1} << 30);
}

TEST(MemoryHeadroomTest, NothingReadableIsNoFigureAndThisHostHasOne) {
  FakeHost empty;
  const MemoryHeadroom none = ReadMemoryHeadroom(empty.root());
  EXPECT_EQ(none.host, std::nullopt);
  EXPECT_EQ(none.cgroup, std::nullopt);
  const MemoryHeadroom here = ReadMemoryHeadroom();
  ASSERT_TRUE(here.host.has_value());
  EXPECT_GT(*here.host, 0);
}

// The least of the pod's figure, half the host's and the cap, named.
TEST(MemoryHeadroomTest, TheBudgetIsTheLeastOfThePodsHalfTheHostsAndTheCapAndNamesIt) {
  const std::string cap = "TIDAL_READ_AHEAD_MAX_BYTES";
  MemoryBudget b = BudgetWithin({1000, std::nullopt}, -1, cap);
  EXPECT_EQ(b.bytes, 500);
  EXPECT_EQ(b.bound, "half of the 1000 bytes the host has left");
  b = BudgetWithin({1000, 700}, -1, cap);  // the pod's own limit is not halved
  EXPECT_EQ(b.bytes, 500);
  b = BudgetWithin({1000, 300}, -1, cap);
  EXPECT_EQ(b.bytes, 300);
  EXPECT_EQ(b.bound, "what the pod's memory limit leaves");
  b = BudgetWithin({1000, 300}, 0, cap);
  EXPECT_EQ(b.bytes, 0);
  EXPECT_EQ(b.bound, "the cap TIDAL_READ_AHEAD_MAX_BYTES sets");
  b = BudgetWithin({1000, 300}, 400, cap);  // a cap above the figures changes nothing
  EXPECT_EQ(b.bytes, 300);
  b = BudgetWithin({std::nullopt, std::nullopt}, -1, cap);
  EXPECT_EQ(b.bytes, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(b.bound, "no figure of the host's");
}

}  // namespace
}  // namespace tidal
