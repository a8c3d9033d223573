// worker/engine/process_memory.cc
#include "worker/engine/process_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace tidal {

std::optional<ProcessMemory> ReadProcessMemory() {
  std::ifstream status("/proc/self/status");
  if (!status) return std::nullopt;
  ProcessMemory memory;
  bool rss = false, peak = false;
  for (std::string line; std::getline(status, line);) {
    // "VmRSS:	  123456 kB"
    const bool is_rss = line.rfind("VmRSS:", 0) == 0, is_peak = line.rfind("VmHWM:", 0) == 0;
    if (!is_rss && !is_peak) continue;
    std::istringstream fields(line.substr(6));
    int64_t kib = 0;
    std::string unit;
    if (!(fields >> kib >> unit) || unit != "kB") return std::nullopt;
    (is_rss ? memory.rss_bytes : memory.peak_rss_bytes) = kib * 1024;
    (is_rss ? rss : peak) = true;
  }
  if (!rss || !peak) return std::nullopt;
  return memory;
}

bool ResetPeakRss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  if (!clear_refs) return false;
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

namespace {

// The first number in the file at `path`; nullopt where it cannot be read or holds none
// ("max", cgroup v2's no limit, included).
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  int64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// The value of `key` in a "key value" file (memory.stat); 0 where it is absent.
int64_t StatValue(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return 0;
}

// What the memory cgroup at `dir` leaves: its limit less its usage, where the usage does not
// count the inactive page cache, which the kernel reclaims before it would fail an allocation
// (kubelet's working set does the same); nullopt where it has no limit. (v1 writes "no
// limit" as a number near 2^63.)
std::optional<int64_t> CgroupLeft(const std::string& dir, bool v2) {
  const std::optional<int64_t> limit =
      ReadNumber(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  const std::optional<int64_t> usage =
      ReadNumber(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  if (!limit || !usage || *limit >= (int64_t{1} << 62)) return std::nullopt;
  const int64_t inactive_file =
      StatValue(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
  return std::max<int64_t>(0, *limit - std::max<int64_t>(0, *usage - inactive_file));
}

}  // namespace

MemoryHeadroom ReadMemoryHeadroom(const std::string& root) {
  MemoryHeadroom headroom;
  std::ifstream meminfo(root + "/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;  // "MemAvailable:   22497356 kB"
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") headroom.host = kib * 1024;
  }
  // "0::/path" (v2) or "4:memory:/path" (v1, "memory,hugetlb" where co-mounted): the
  // process's cgroup. Inside a cgroup namespace the path is "/" and the mount's root is the
  // process's own cgroup.
  std::ifstream cgroups(root + "/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string path = line.substr(second + 1);
    const bool v2 = line.rfind("0::", 0) == 0;
    bool memory = false;  // one of the comma-separated controllers
    std::istringstream controllers(line.substr(first + 1, second - first - 1));
    for (std::string c; std::getline(controllers, c, ',');) memory = memory || c == "memory";
    if (!v2 && !memory) continue;
    // Without a cgroup namespace a container sees its host's path, while its runtime mounts
    // its own cgroup at the mount's root: where the path is not there, the root is used.
    // (A co-mounted v1 hierarchy is reached through its "memory" link.)
    const std::string mount = root + (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
    std::error_code ec;
    const std::string dir = std::filesystem::is_directory(mount + path, ec) ? mount + path : mount;
    const std::optional<int64_t> left = CgroupLeft(dir, v2);
    if (left) headroom.cgroup = headroom.cgroup ? std::min(*headroom.cgroup, *left) : *left;
  }
  return headroom;
}

MemoryBudget BudgetWithin(const MemoryHeadroom& headroom, int64_t cap,
                          const std::string& cap_name) {
  MemoryBudget budget{std::numeric_limits<int64_t>::max(), "no figure of the host's"};
  if (headroom.host && *headroom.host / 2 < budget.bytes)
    budget = {*headroom.host / 2,
              "half of the " + std::to_string(*headroom.host) + " bytes the host has left"};
  if (headroom.cgroup && *headroom.cgroup < budget.bytes)
    budget = {*headroom.cgroup, "what the pod's memory limit leaves"};
  if (cap >= 0 && cap < budget.bytes) budget = {cap, "the cap " + cap_name + " sets"};
  return budget;
}

}  // namespace tidal
