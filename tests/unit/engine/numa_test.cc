// NUMA binding of a worker: the kernel's cpulist format, the nodes as sysfs shows them (a fake
// tree here), the choice for a GPU rank and a CPU rank, and the binding itself on this machine.
#include "worker/engine/numa.h"

#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace tidal::numa {
namespace {

TEST(Numa, CpuListsReadAsTheKernelWritesThem) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList("5"), (std::vector<int>{5}));
  EXPECT_EQ(*ParseCpuList("\n"), (std::vector<int>{}));  // a memory-only node
  for (const char* bad : {"0-", "a", "3-1", "1,,2", "-1", "0-99999999"}) {
    auto parsed = ParseCpuList(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("is not a CPU number or range"), std::string::npos)
        << parsed.status().message();
  }
}

class FakeSys {
 public:
  FakeSys() {
    root_ = std::filesystem::temp_directory_path() /
            ("tidal-numa-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  ~FakeSys() { std::filesystem::remove_all(root_); }
  void Node(int id, const std::string& cpulist) {
    const auto dir = root_ / "devices" / "system" / "node" / ("node" + std::to_string(id));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "cpulist") << cpulist << "\n";
  }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

TEST(Numa, NodesAreReadFromSysfsByIdAndThoseWithoutCpusAreLeftOut) {
  FakeSys sys;
  sys.Node(1, "24-47,72-95");
  sys.Node(0, "0-23,48-71");
  sys.Node(2, "");  // memory only (CXL, HBM)
  std::filesystem::create_directories(sys.root() / "devices/system/node/power");
  const std::vector<Node> nodes = ReadNodes(sys.root());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].id, 0);
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_EQ(nodes[1].cpus.size(), 48u);
  EXPECT_EQ(nodes[1].cpus.front(), 24);
  EXPECT_TRUE(ReadNodes(sys.root() / "missing").empty());
}

std::vector<int> Range(int from, int to) {
  std::vector<int> out;
  for (int c = from; c <= to; ++c) out.push_back(c);
  return out;
}

TEST(Numa, AGpuRankGoesToItsGpusNodeAndACpuRankOnlyWhereItsCpusesAreOnOne) {
  const std::vector<Node> two = {{0, Range(0, 7)}, {1, Range(8, 15)}};
  const std::vector<int> all = Range(0, 15);
  std::string why;
  // GPU: the node holding the CPUs NVML calls ideal for it, on those CPUs.
  auto gpu = Choose(two, all, Range(8, 11), &why);
  ASSERT_TRUE(gpu) << why;
  EXPECT_EQ(gpu->node, 1);
  EXPECT_EQ(gpu->cpus, Range(8, 11));
  // Within the container's cpuset only.
  gpu = Choose(two, Range(10, 15), Range(8, 15), &why);
  ASSERT_TRUE(gpu) << why;
  EXPECT_EQ(gpu->cpus, Range(10, 15));
  EXPECT_FALSE(Choose(two, Range(0, 7), Range(8, 15), &why));
  EXPECT_NE(why.find("cpuset"), std::string::npos) << why;
  // CPU: the node its cpuset lies on (a container pinned to a socket), with those CPUs; one
  // that may run anywhere is not narrowed (it does not know how many ranks share the machine).
  auto cpu = Choose(two, Range(9, 12), std::nullopt, &why);
  ASSERT_TRUE(cpu) << why;
  EXPECT_EQ(cpu->node, 1);
  EXPECT_EQ(cpu->cpus, Range(9, 12));
  EXPECT_FALSE(Choose(two, all, std::nullopt, &why));
  EXPECT_NE(why.find("not narrowed"), std::string::npos) << why;
  EXPECT_FALSE(Choose(two, Range(6, 9), std::nullopt, &why));
  // Nothing to choose: one node and no GPU, or no node at all.
  EXPECT_FALSE(Choose({{0, Range(0, 1)}}, Range(0, 1), std::nullopt, &why));
  EXPECT_NE(why.find("one NUMA node"), std::string::npos) << why;
  EXPECT_FALSE(Choose({}, all, Range(0, 3), &why));
  // A GPU whose CPUs no node shows, or every node's (local to none: a VM's passed-through GPU).
  EXPECT_FALSE(Choose(two, all, std::vector<int>{40, 41}, &why));
  EXPECT_FALSE(Choose(two, all, all, &why));
  EXPECT_NE(why.find("local to none"), std::string::npos) << why;
  // One node: nothing to choose, GPU or not.
  EXPECT_FALSE(Choose({{0, Range(0, 1)}}, Range(0, 1), Range(0, 1), &why));
}

// The real system calls, on a thread of its own (affinity and memory policy are per thread, and
// inherited by the threads it starts): bound to node 0 with the CPUs it may use already.
// A container whose seccomp profile refuses set_mempolicy (no CAP_SYS_NICE) gets the CPUs bound
// and a FailedPrecondition saying the memory is not; its memory policy is then not checked.
TEST(Numa, ApplyBindsTheThreadAndItsChildrenToTheCpusAndPrefersTheNodesMemory) {
  std::thread([] {
    const std::vector<int> allowed = AllowedCpus();
    ASSERT_FALSE(allowed.empty());
    EXPECT_EQ(UsableCpus(), static_cast<int>(allowed.size()));
    // Out of range: refused before anything is bound.
    EXPECT_EQ(Apply({.node = -1, .cpus = {allowed.back()}, .reason = "bad"}).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(Apply({.node = 0, .cpus = {}, .reason = "none"}).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(AllowedCpus(), allowed);
    const std::vector<int> one = {allowed.back()};
    Status s = Apply({.node = 0, .cpus = one, .reason = "test"});
    EXPECT_EQ(AllowedCpus(), one);
    EXPECT_EQ(UsableCpus(), 1);
    std::vector<int> child;
    std::thread([&] { child = AllowedCpus(); }).join();
    EXPECT_EQ(child, one) << "a thread started after the binding is not bound";
    if (s.code() == StatusCode::kFailedPrecondition) {
      EXPECT_NE(s.message().find("memory is not preferred"), std::string::npos) << s.ToString();
      return;
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    int mode = -1;
    unsigned long mask = 0;
    ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, &mask, 8 * sizeof mask, nullptr, 0), 0);
    EXPECT_EQ(mode, MPOL_PREFERRED);
    EXPECT_EQ(mask, 1UL);
  }).join();
}

}  // namespace
}  // namespace tidal::numa
