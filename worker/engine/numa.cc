// worker/engine/numa.cc
#include "worker/engine/numa.h"

#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

namespace tidal::numa {
namespace {

std::optional<int> ReadInt(std::string_view text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < 0) return std::nullopt;
  return value;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

// The largest CPU or node number accepted: far beyond any machine, small enough for a bitmask.
constexpr int kMaxCpu = 1 << 16;

}  // namespace

StatusOr<std::vector<int>> ParseCpuList(std::string_view text) {
  std::set<int> cpus;
  text = Trim(text);
  if (text.empty()) return std::vector<int>();
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view part = text.substr(start, comma - start);
    const size_t dash = part.find('-');
    const std::optional<int> first = ReadInt(part.substr(0, dash));
    const std::optional<int> last =
        dash == std::string_view::npos ? first : ReadInt(part.substr(dash + 1));
    if (!first || !last || *last < *first || *last >= kMaxCpu)
      return InvalidArgument("cpulist \"" + std::string(text) + "\": \"" + std::string(part) +
                             "\" is not a CPU number or range");
    for (int c = *first; c <= *last; ++c) cpus.insert(c);
    start = comma + 1;
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

std::vector<Node> ReadNodes(const std::filesystem::path& sys) {
  std::vector<Node> nodes;
  std::error_code ec;
  const std::filesystem::path dir = sys / "devices" / "system" / "node";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0) continue;
    const std::optional<int> id = ReadInt(std::string_view(name).substr(4));
    if (!id) continue;
    std::ifstream in(entry.path() / "cpulist");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto cpus = ParseCpuList(text);
    if (!cpus.ok() || cpus->empty()) continue;  // a memory-only node (CXL, HBM) runs no thread
    nodes.push_back({*id, *cpus});
  }
  std::sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) { return a.id < b.id; });
  return nodes;
}

std::optional<Binding> Choose(const std::vector<Node>& nodes, const std::vector<int>& allowed,
                              const std::optional<std::vector<int>>& gpu_cpus,
                              std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<Binding> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  if (nodes.empty()) return fail("no NUMA node in sysfs");
  const std::set<int> may(allowed.begin(), allowed.end());
  auto within = [&](const std::vector<int>& cpus) {
    std::vector<int> out;
    for (int c : cpus)
      if (may.count(c)) out.push_back(c);
    return out;
  };
  if (nodes.size() < 2) return fail("one NUMA node: nothing to choose");
  Binding b;
  if (gpu_cpus && !gpu_cpus->empty()) {
    const std::set<int> near(gpu_cpus->begin(), gpu_cpus->end());
    size_t most = 0;
    for (const Node& n : nodes) {
      const size_t shared = static_cast<size_t>(
          std::count_if(n.cpus.begin(), n.cpus.end(), [&](int c) { return near.count(c) > 0; }));
      if (shared > most) {
        most = shared;
        b.node = n.id;
      }
    }
    if (b.node < 0) return fail("the GPU's CPUs are on no NUMA node sysfs shows");
    // A GPU NVML gives every CPU (no NUMA locality: a VM's passed-through device) is local to
    // no node: binding it to the first would crowd every such rank onto node 0's memory.
    if (most < near.size())
      return fail("the GPU's CPUs span several NUMA nodes: it is local to none");
    b.cpus = within(*gpu_cpus);
    b.reason = "the GPU's CPUs (NVML)";
    if (b.cpus.empty())
      return fail("none of the GPU's CPUs is one this process may use (its cpuset)");
    return b;
  }
  if (allowed.empty()) return fail("no CPU this process may use");
  for (const Node& n : nodes) {
    const std::set<int> on(n.cpus.begin(), n.cpus.end());
    if (!std::all_of(allowed.begin(), allowed.end(), [&](int c) { return on.count(c) > 0; }))
      continue;
    b.node = n.id;
    b.cpus = allowed;
    b.reason = "every CPU it may use is on node " + std::to_string(n.id);
    return b;
  }
  return fail("a CPU rank that may run on several NUMA nodes is not narrowed to one");
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

int UsableCpus() {
  const size_t allowed = AllowedCpus().size();
  if (allowed > 0) return static_cast<int>(allowed);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Status Apply(const Binding& binding) {
  // Everything checked before anything is bound.
  if (binding.cpus.empty()) return InvalidArgument("numa: a binding without CPUs");
  if (binding.node < 0 || binding.node >= kMaxCpu)
    return InvalidArgument("numa: node " + std::to_string(binding.node));
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : binding.cpus) {
    if (c < 0 || c >= CPU_SETSIZE) return InvalidArgument("numa: CPU " + std::to_string(c));
    CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    return Internal(std::string("numa: sched_setaffinity: ") + std::strerror(errno));
  std::vector<unsigned long> mask(static_cast<size_t>(binding.node) / (8 * sizeof(long)) + 1, 0);
  mask[static_cast<size_t>(binding.node) / (8 * sizeof(long))] |=
      1UL << (static_cast<size_t>(binding.node) % (8 * sizeof(long)));
  if (syscall(SYS_set_mempolicy, MPOL_PREFERRED, mask.data(), mask.size() * 8 * sizeof(long) + 1) !=
      0)
    return FailedPrecondition(
        "the threads are bound to node " + std::to_string(binding.node) +
        "'s CPUs, but its memory is not preferred: set_mempolicy: " + std::strerror(errno));
  return OkStatus();
}

}  // namespace tidal::numa
