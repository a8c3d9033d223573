// worker/engine/numa.h — binding a worker to the NUMA node of its GPU (issue 27's placement, inside
// the node): its threads run on that node's CPUs and its memory comes from that node first, so the
// host side of the training step (data loading, the optimizer's host copies, pinned buffers for
// the GPU) does not cross the socket interconnect. The topology is read from sysfs
// (/sys/devices/system/node); the GPU's CPUs come from NVML (worker/control/gpu_monitor.h). A
// CPU rank (no GPU) is only given its node's memory where every CPU it may use is on one node
// (a container the kubelet's static CPU manager pinned to a socket): it does not know how many
// ranks share the machine, so it is never narrowed to fewer CPUs than it was given. Never
// fatal: what cannot be bound is said and left as the kernel placed it. No LibTorch, no libnuma
// (two system calls).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tidal::numa {

// "0-3,8,10-11" (the kernel's cpulist format) → {0, 1, 2, 3, 8, 10, 11}; InvalidArgument
// naming the part that does not read.
StatusOr<std::vector<int>> ParseCpuList(std::string_view text);

struct Node {
  int id = 0;
  std::vector<int> cpus;  // sorted
};
// The machine's NUMA nodes with CPUs (SYS/devices/system/node/node<N>/cpulist), by id; empty
// when sysfs shows none (not Linux, a kernel without NUMA).
std::vector<Node> ReadNodes(const std::filesystem::path& sys = "/sys");

struct Binding {
  int node = -1;
  std::vector<int> cpus;  // where the threads may run: the node's, within what the process may use
  std::string reason;     // "the GPU's CPUs (NVML)", "every CPU it may use is on node 1"
};

// Where to bind: with `gpu_cpus` (the CPUs NVML calls ideal for the rank's GPU) the node that
// holds most of them, its threads on those of them in `allowed` (the process's affinity: a
// container's cpuset); without, the node that holds every CPU in `allowed`, with those CPUs.
// nullopt, with `why_not`, when there is nothing to choose (one node; a CPU rank that may run on
// several) or the choice leaves no allowed CPU.
std::optional<Binding> Choose(const std::vector<Node>& nodes, const std::vector<int>& allowed,
                              const std::optional<std::vector<int>>& gpu_cpus,
                              std::string* why_not);

// The CPUs the calling thread may run on (sched_getaffinity).
std::vector<int> AllowedCpus();
// How many: what a thread pool should size itself by (std::thread::hardware_concurrency counts
// every online CPU, a container's cpuset and a NUMA binding aside); at least 1.
int UsableCpus();
// Binds the calling thread — and every thread it starts afterwards, which inherit both — to the
// binding's CPUs, with its node's memory preferred (MPOL_PREFERRED: another node's when that one
// is full, never an allocation failure). InvalidArgument, binding nothing, for a binding out of
// range; FailedPrecondition when the CPUs are bound but the memory policy is refused (a
// container's seccomp profile refuses set_mempolicy without CAP_SYS_NICE), saying so.
Status Apply(const Binding& binding);

}  // namespace tidal::numa
