// tests/unit/worker/fake_nvml.cc — an NVML stand-in for GpuMonitor's tests: the C functions the
// monitor loads, with NVML's signatures, answering for two GPUs as a driver would. GPU 0 sits on
// CPUs 2-3 and 66 (the second word of the mask), GPU 1 on none that NVML would say.
#include <cstring>

extern "C" {

typedef int nvmlReturn_t;  // 0: NVML_SUCCESS
typedef void* nvmlDevice_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

int devices[2];

nvmlReturn_t nvmlInit_v2() { return 0; }
nvmlReturn_t nvmlShutdown() { return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (index >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &devices[index];
  return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (std::strcmp(uuid, "GPU-0000-aaaa") == 0)
    *device = &devices[0];
  else if (std::strcmp(uuid, "GPU-1111-bbbb") == 0)
    *device = &devices[1];
  else
    return 6;  // NVML_ERROR_NOT_FOUND
  return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  u->gpu = device == &devices[0] ? 40 : 60;
  u->memory = 10;
  return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t* m) {
  m->total = 80ull << 30;
  m->used = 20ull << 30;
  m->free = m->total - m->used;
  return 0;
}
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                      unsigned long* cpuSet) {
  std::memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
  if (device != &devices[0]) return 0;
  if (cpuSetSize < 2) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  cpuSet[0] = (1UL << 2) | (1UL << 3);
  cpuSet[1] = 1UL << 2;  // CPU 66
  return 0;
}

}  // extern "C"
