#include "worker/control/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace tidal::worker {
namespace {

// The few NVML declarations used here (nvml.h is not a build dependency). Their layout is
// NVML's stable C ABI: nvmlReturn_t is an int, 0 is NVML_SUCCESS, handles are opaque.
using NvmlReturn = int;
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu, memory;  // percent of the last sample period
};
struct NvmlMemory {
  unsigned long long total, free, used;  // bytes
};

}  // namespace

struct GpuMonitor::Nvml {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*count)(unsigned int*) = nullptr;
  NvmlReturn (*handle)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  // Optional: a CPU bitmask in unsigned longs, bit c of word c / 64 for CPU c.
  NvmlReturn (*cpu_affinity)(NvmlDevice, unsigned int, unsigned long*) = nullptr;
  NvmlReturn (*by_uuid)(const char*, NvmlDevice*) = nullptr;  // optional
  std::vector<NvmlDevice> devices;
  std::mutex mu;  // NVML is thread-safe; this keeps Sample's reads of `devices` simple

  ~Nvml() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }
};

std::unique_ptr<GpuMonitor> GpuMonitor::Open(std::string* why_not, const std::string& library) {
  auto nvml = std::make_unique<Nvml>();
  nvml->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!nvml->library) {
    const char* error = dlerror();
    if (why_not) *why_not = "NVML not available (" + std::string(error ? error : library) + ")";
    return nullptr;
  }
  auto symbol = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(nvml->library, name));
    return fn != nullptr;
  };
  bool ok = symbol(nvml->init, "nvmlInit_v2") && symbol(nvml->count, "nvmlDeviceGetCount_v2") &&
            symbol(nvml->handle, "nvmlDeviceGetHandleByIndex_v2") &&
            symbol(nvml->utilization, "nvmlDeviceGetUtilizationRates") &&
            symbol(nvml->memory, "nvmlDeviceGetMemoryInfo");
  if (!ok) {
    if (why_not) *why_not = library + " lacks the NVML functions used";
    return nullptr;
  }
  if (nvml->init() != 0) {
    if (why_not) *why_not = "nvmlInit failed (no NVIDIA driver?)";
    return nullptr;
  }
  symbol(nvml->shutdown, "nvmlShutdown");  // only once init succeeded
  symbol(nvml->cpu_affinity, "nvmlDeviceGetCpuAffinity");
  symbol(nvml->by_uuid, "nvmlDeviceGetHandleByUUID");
  unsigned int count = 0;
  if (nvml->count(&count) != 0 || count == 0) {
    if (why_not) *why_not = "NVML sees no GPU";
    return nullptr;
  }
  for (unsigned int i = 0; i < count; ++i) {
    NvmlDevice device = nullptr;
    if (nvml->handle(i, &device) == 0) nvml->devices.push_back(device);
  }
  if (nvml->devices.empty()) {
    if (why_not) *why_not = "NVML returned no device handle";
    return nullptr;
  }
  return std::unique_ptr<GpuMonitor>(new GpuMonitor(std::move(nvml)));
}

GpuMonitor::GpuMonitor(std::unique_ptr<Nvml> nvml) : nvml_(std::move(nvml)) {}
GpuMonitor::~GpuMonitor() = default;

int GpuMonitor::devices() const { return static_cast<int>(nvml_->devices.size()); }

std::optional<int> GpuMonitor::IndexOf(const std::string& visible_devices) {
  const std::string first = visible_devices.substr(0, visible_devices.find(','));
  if (first.empty() || first == "all") return 0;
  std::lock_guard<std::mutex> lock(nvml_->mu);
  const int count = static_cast<int>(nvml_->devices.size());
  if (std::all_of(first.begin(), first.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (first.size() > 4) return std::nullopt;
    const int index = std::stoi(first);
    return index < count ? std::optional<int>(index) : std::nullopt;
  }
  NvmlDevice device = nullptr;
  if (!nvml_->by_uuid || nvml_->by_uuid(first.c_str(), &device) != 0) return std::nullopt;
  for (int i = 0; i < count; ++i)
    if (nvml_->devices[static_cast<size_t>(i)] == device) return i;
  return std::nullopt;
}

std::optional<std::vector<int>> GpuMonitor::IdealCpus(int index) {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  if (!nvml_->cpu_affinity || index < 0 || index >= static_cast<int>(nvml_->devices.size()))
    return std::nullopt;
  constexpr unsigned int kWords = 1024 / (8 * sizeof(unsigned long));  // 1,024 CPUs
  std::vector<unsigned long> mask(kWords, 0);
  if (nvml_->cpu_affinity(nvml_->devices[static_cast<size_t>(index)], kWords, mask.data()) != 0)
    return std::nullopt;
  std::vector<int> cpus;
  for (unsigned int w = 0; w < kWords; ++w)
    for (unsigned int b = 0; b < 8 * sizeof(unsigned long); ++b)
      if (mask[w] & (1UL << b)) cpus.push_back(static_cast<int>(w * 8 * sizeof(unsigned long) + b));
  if (cpus.empty()) return std::nullopt;
  return cpus;
}

std::optional<GpuSample> GpuMonitor::Sample() {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  GpuSample sample;
  double utilization = 0;
  for (NvmlDevice device : nvml_->devices) {
    NvmlUtilization u{};
    NvmlMemory m{};
    if (nvml_->utilization(device, &u) != 0 || nvml_->memory(device, &m) != 0) return std::nullopt;
    utilization += u.gpu;
    sample.memory_used_bytes += static_cast<int64_t>(m.used);
    sample.memory_total_bytes += static_cast<int64_t>(m.total);
    ++sample.devices;
  }
  sample.utilization_percent = utilization / sample.devices;
  return sample;
}

}  // namespace tidal::worker
