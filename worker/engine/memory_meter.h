// worker/engine/memory_meter.h — how much memory the training step's tensors take, for the
// automatic micro-batch (spec.optimization.microBatchSize: auto): device memory on a GPU, from
// the CUDA caching allocator's own counters; on CPU the bytes of the tensors the training
// thread allocates during steps (activations, gradients, optimizer state: what a bigger
// micro-batch changes), through a counting allocator this meter puts in front of LibTorch's.
// The process's RSS also holds code, the data loader's buffers and freed-but-kept heap, and
// background threads (a read ahead, the checkpoint writer) are neither counted nor limited.
//
// The limit is the device's memory (a GPU's total; on CPU the cgroup's memory.max, else the
// host's memory left), or TIDAL_MEMORY_LIMIT_BYTES where set: an artificial limit that the CPU
// meter also enforces on the counted allocations, failing one past it with LibTorch's own
// out-of-memory error, as a GPU would. TIDAL_TEST_OOM_AT_STEP=k (tests) fails the first allocation
// of 64 KiB or more of step k once, on every rank that has it set.
#pragma once

#include <cstdint>
#include <memory>

#include <torch/torch.h>

#include "common/status.h"

namespace tidal::engine {

class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  virtual int64_t InUse() const = 0;  // bytes of tensors now
  virtual int64_t Peak() const = 0;   // the most InUse reached since ResetPeak
  virtual void ResetPeak() = 0;
  int64_t limit() const { return limit_; }
  // Fails the next allocation of at least `min_bytes` once, as out of memory (a test's injected
  // failure); on a GPU, where the meter does not allocate, the next Check does.
  virtual void FailNextAllocation(int64_t min_bytes) = 0;
  virtual void CancelFailure() = 0;  // what FailNextAllocation armed and has not fired
  // Throws c10::OutOfMemoryError where a failure is armed and cannot be injected into the
  // allocator (GPU). A no-op elsewhere.
  virtual void Check() {}
  // CPU: whether this thread's allocations are counted, limited and may be failed (the
  // training thread during a step); other threads' never are. A GPU's allocator counts all.
  virtual void CountThisThread(bool on) { (void)on; }

 protected:
  int64_t limit_ = 0;
};

struct MemoryMeterOptions {
  int64_t limit_bytes = 0;       // 0: the device's memory
  int64_t test_oom_at_step = 0;  // TIDAL_TEST_OOM_AT_STEP; 0: none
};
// TIDAL_MEMORY_LIMIT_BYTES and TIDAL_TEST_OOM_AT_STEP; a bad value names the variable.
StatusOr<MemoryMeterOptions> MemoryMeterOptionsFromEnv();

// The meter for `device`. On CPU it installs the counting allocator (once per process; a
// later meter shares its counters).
StatusOr<std::unique_ptr<MemoryMeter>> MakeMemoryMeter(const torch::Device& device,
                                                       const MemoryMeterOptions& options);

}  // namespace tidal::engine
