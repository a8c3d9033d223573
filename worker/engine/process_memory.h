// worker/engine/process_memory.h — this process's resident memory as the kernel counts it
// (/proc/self/status: VmRSS now, VmHWM its peak so far), for logs and benchmarks that must show
// what a phase held in host memory; and how much more host memory it may still take.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tidal {

struct ProcessMemory {
  int64_t rss_bytes = 0;       // resident now (anonymous, file-backed and shared pages)
  int64_t peak_rss_bytes = 0;  // the most ever resident at once
};

// nullopt where /proc/self/status cannot be read or lacks the fields (not Linux).
std::optional<ProcessMemory> ReadProcessMemory();

// Starts the peak over from the current resident size (writes 5 to /proc/self/clear_refs,
// Linux ≥ 4.0), so that a later peak_rss_bytes is one phase's; false where that is refused.
bool ResetPeakRss();

// The host memory this process may still take, as two figures, since they are shared
// differently: what the whole host has left (/proc/meminfo's MemAvailable, which every process
// on it draws on) and what the memory cgroup of the process (/proc/self/cgroup; cgroup v2
// memory.max, or v1 memory.limit_in_bytes, less the usage without the inactive page cache)
// leaves to it and its pod. Each nullopt where it cannot be read or there is no limit. Every
// path is taken under `root` (tests give a tree).
struct MemoryHeadroom {
  std::optional<int64_t> host;
  std::optional<int64_t> cgroup;
};
MemoryHeadroom ReadMemoryHeadroom(const std::string& root = "");

// The most host memory one rank's optional work (a read ahead) may take: what its pod's cgroup
// leaves, half of what the host leaves (the ranks on one host draw on that figure together,
// each from its own pod) and `cap` (< 0: none), whichever is least; `bound` names which.
struct MemoryBudget {
  int64_t bytes = 0;
  std::string bound;
};
MemoryBudget BudgetWithin(const MemoryHeadroom& headroom, int64_t cap, const std::string& cap_name);

}  // namespace tidal
