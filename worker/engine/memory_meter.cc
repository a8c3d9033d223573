#include "worker/engine/memory_meter.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#ifdef TIDAL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "common/flags.h"
#include "worker/engine/failpoints.h"
#include "worker/engine/process_memory.h"

namespace tidal::engine {
namespace {

// LibTorch's CPU allocations (c10::alloc_cpu, as its default allocator makes them) with the
// bytes of those made on a counted thread — the training thread inside a step (CountingScope) —
// tallied until they are freed, on whatever thread. Background threads (a read ahead, the
// checkpoint writer) are neither counted nor limited, so that their work never raises the
// step's peak nor fails there. Over a limit, or where a failure is armed, a counted allocation
// fails as LibTorch's own out-of-memory does (c10::OutOfMemoryError).
//
// Each block is one allocation with a 64-byte header (keeping the data 64-byte aligned) that
// holds its size and whether it was counted: the data pointer is its own context, as oneDNN's
// raw_allocate/raw_deallocate (bf16 kernels on CPU) require.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;

  c10::DataPtr allocate(size_t n) override {
    const bool counted = counting_;
    const int64_t bytes = static_cast<int64_t>(n);
    if (counted) {
      int64_t armed = fail_at_least_.load();
      if (armed > 0 && bytes >= armed && fail_at_least_.compare_exchange_strong(armed, 0)) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, "injected allocation failure of ", bytes,
                         " bytes (TIDAL_TEST_OOM_AT_STEP)");
      }
      const int64_t limit = limit_.load();
      const int64_t now = in_use_.fetch_add(bytes) + bytes;
      if (limit > 0 && now > limit) {
        in_use_.fetch_sub(bytes);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU tensor memory limit: allocating ", bytes,
                         " bytes with ", now - bytes, " in use exceeds ", limit,
                         " (TIDAL_MEMORY_LIMIT_BYTES)");
      }
      for (int64_t peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
      }
    }
    auto* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    auto* header = reinterpret_cast<Header*>(base);
    header->bytes = counted ? bytes : -1;
    header->owner = this;
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &Free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t in_use() const { return in_use_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(in_use_.load()); }
  void set_limit(int64_t bytes) { limit_.store(bytes); }
  void FailNext(int64_t min_bytes) { fail_at_least_.store(std::max<int64_t>(min_bytes, 1)); }
  void Cancel() { fail_at_least_.store(0); }
  static void SetCounting(bool on) { counting_ = on; }

 private:
  struct Header {
    int64_t bytes;  // -1: not counted
    CountingCpuAllocator* owner;
  };
  static_assert(sizeof(Header) <= kHeader);
  static void Free(void* data) {
    if (!data) return;
    char* base = static_cast<char*>(data) - kHeader;
    const Header* header = reinterpret_cast<const Header*>(base);
    if (header->bytes >= 0) header->owner->in_use_.fetch_sub(header->bytes);
    c10::free_cpu(base);
  }
  static thread_local bool counting_;
  std::atomic<int64_t> in_use_{0}, peak_{0}, limit_{0}, fail_at_least_{0};
};
thread_local bool CountingCpuAllocator::counting_ = false;

CountingCpuAllocator& InstalledCpuAllocator() {
  // Installed once, never removed: tensors it allocated may outlive any one trainer. Above
  // every priority LibTorch itself sets.
  static CountingCpuAllocator* allocator = [] {
    auto* a = new CountingCpuAllocator();
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

class CpuMemoryMeter final : public MemoryMeter {
 public:
  CpuMemoryMeter(CountingCpuAllocator& a, int64_t limit, bool enforce) : a_(a) {
    limit_ = limit;
    if (enforce) a_.set_limit(limit);
  }
  int64_t InUse() const override { return a_.in_use(); }
  int64_t Peak() const override { return a_.peak(); }
  void ResetPeak() override { a_.ResetPeak(); }
  void FailNextAllocation(int64_t min_bytes) override { a_.FailNext(min_bytes); }
  void CancelFailure() override { a_.Cancel(); }
  void CountThisThread(bool on) override { CountingCpuAllocator::SetCounting(on); }

 private:
  CountingCpuAllocator& a_;
};

#ifdef TIDAL_WITH_CUDA
namespace cuda_alloc = c10::cuda::CUDACachingAllocator;

class CudaMemoryMeter final : public MemoryMeter {
 public:
  CudaMemoryMeter(c10::DeviceIndex device, int64_t limit) : device_(device) { limit_ = limit; }
  int64_t InUse() const override { return Stat().current; }
  int64_t Peak() const override { return Stat().peak; }
  void ResetPeak() override { cuda_alloc::resetPeakStats(device_); }
  void FailNextAllocation(int64_t min_bytes) override {
    (void)min_bytes;
    armed_ = true;
  }
  void CancelFailure() override { armed_ = false; }
  void Check() override {
    if (!armed_) return;
    armed_ = false;
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "injected CUDA out-of-memory (TIDAL_TEST_OOM_AT_STEP)");
  }

 private:
  c10::CachingAllocator::Stat Stat() const {
    return cuda_alloc::getDeviceStats(device_)
        .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  }
  c10::DeviceIndex device_;
  bool armed_ = false;
};
#endif

StatusOr<int64_t> EnvInt(const char* name, int64_t min) {
  const char* value = std::getenv(name);
  if (!value || !*value) return int64_t{0};
  return ParseIntFlag<int64_t>(name, value, min);
}

}  // namespace

StatusOr<MemoryMeterOptions> MemoryMeterOptionsFromEnv() {
  MemoryMeterOptions o;
  TIDAL_ASSIGN_OR_RETURN(o.limit_bytes, EnvInt("TIDAL_MEMORY_LIMIT_BYTES", 1));
  TIDAL_ASSIGN_OR_RETURN(const Failpoints failpoints, Failpoints::FromProcess());
  if (const std::string oom = failpoints.Get("TIDAL_TEST_OOM_AT_STEP"); !oom.empty()) {
    TIDAL_ASSIGN_OR_RETURN(o.test_oom_at_step,
                           ParseIntFlag<int64_t>("TIDAL_TEST_OOM_AT_STEP", oom, 1));
  }
  return o;
}

StatusOr<std::unique_ptr<MemoryMeter>> MakeMemoryMeter(const torch::Device& device,
                                                       const MemoryMeterOptions& options) {
#ifdef TIDAL_WITH_CUDA
  if (device.is_cuda()) {
    int64_t limit = options.limit_bytes;
    if (limit == 0) {
      // What this process may still have of its own GPU: what is free there and what its
      // caching allocator already holds (other processes, CUDA contexts and NCCL's buffers are
      // not ours to count on).
      // Through LibTorch's allocator (it guards the device): no CUDA runtime call of the
      // engine's own, so the worker links no libcudart beside LibTorch's.
      size_t free_bytes = 0;
      try {
        free_bytes = cuda_alloc::get()->getMemoryInfo(device.index()).first;
      } catch (const c10::Error& e) {
        return Unavailable("the memory of GPU " + std::to_string(device.index()) +
                           " is unknown: " + e.what_without_backtrace());
      }
      const auto reserved =
          cuda_alloc::getDeviceStats(device.index())
              .reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
              .current;
      limit = static_cast<int64_t>(free_bytes) + reserved;
    }
    return std::unique_ptr<MemoryMeter>(new CudaMemoryMeter(device.index(), limit));
  }
#endif
  if (!device.is_cpu()) return FailedPrecondition("no memory meter for device " + device.str());
  CountingCpuAllocator& allocator = InstalledCpuAllocator();
  int64_t limit = options.limit_bytes;
  if (limit == 0) {
    // What the tensors may still grow to: what they hold now and what the pod's cgroup and the
    // host leave to this process.
    const MemoryHeadroom headroom = ReadMemoryHeadroom();
    int64_t left = headroom.host.value_or(int64_t{1} << 40);
    if (headroom.cgroup) left = std::min(left, *headroom.cgroup);
    limit = allocator.in_use() + left;
  }
  return std::unique_ptr<MemoryMeter>(
      new CpuMemoryMeter(allocator, limit, /*enforce=*/options.limit_bytes > 0));
}

}  // namespace tidal::engine
