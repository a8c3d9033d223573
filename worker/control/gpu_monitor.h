// worker/control/gpu_monitor.h — the pod's GPU utilisation and memory, read from NVML.
// NVML (libnvidia-ml.so.1) comes with the NVIDIA driver, not with the build: it is loaded at
// run time, so one binary runs on CPU hosts too. Where it cannot be loaded or finds no GPU,
// there is no monitor and the worker reports no GPU figures at all — never a made-up one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tidal::worker {

struct GpuSample {
  double utilization_percent = 0;  // mean over the pod's GPUs, of the last sample period
  int64_t memory_used_bytes = 0, memory_total_bytes = 0;  // summed over the pod's GPUs
  int devices = 0;
};

class GpuMonitor {
 public:
  // The GPUs NVML shows this process (a pod sees its own). nullptr, with `why_not` saying
  // why, when the library does not load or finds no GPU.
  static std::unique_ptr<GpuMonitor> Open(std::string* why_not,
                                          const std::string& library = "libnvidia-ml.so.1");
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // nullopt when NVML fails to answer (a GPU that fell off the bus, the driver reloaded).
  std::optional<GpuSample> Sample();
  int devices() const;
  // The CPUs NVML calls ideal for GPU `index` (nvmlDeviceGetCpuAffinity: those of the NUMA node
  // its PCIe root hangs off); nullopt when NVML cannot say.
  std::optional<std::vector<int>> IdealCpus(int index);
  // NVML's index of the GPU CUDA_VISIBLE_DEVICES (or NVIDIA_VISIBLE_DEVICES) names first: a
  // number is taken as NVML's index (PCI bus order, which CUDA's matches on identical GPUs and
  // with CUDA_DEVICE_ORDER=PCI_BUS_ID), a "GPU-…" or "MIG-…" UUID is looked up; "" or "all":
  // 0. nullopt when NVML knows no such GPU.
  std::optional<int> IndexOf(const std::string& visible_devices);

 private:
  struct Nvml;
  explicit GpuMonitor(std::unique_ptr<Nvml> nvml);
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace tidal::worker
