// common/process_memory.cc
#include "common/process_memory.h"

#include <fstream>
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

}  // namespace tidal
