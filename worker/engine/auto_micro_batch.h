// worker/engine/auto_micro_batch.h — `microBatchSize: auto` as a policy: which micro-batch size
// the next step runs at, from what the steps so far reported. No LibTorch and no collectives:
// the Trainer measures (MemoryMeter), agrees across ranks (every input here is already the same
// on every rank) and runs; this decides. Grown by ×1.2 (at least one more) after a step whose
// peak memory, scaled to the larger size, stays under the target; cut after a step over it; after
// an out-of-memory the failed size is never tried again (the cap).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace tidal::engine {

class AutoMicroBatch {
 public:
  static constexpr double kGrowth = 1.2;

  int64_t size = 1;  // what the next step runs at (every rank the same)
  int64_t cap = 0;  // the largest allowed after an out-of-memory or a peak over the target; 0: none

  // The largest size a step may run at: the rows a rank runs per step (per compression group),
  // or the cap.
  int64_t Max(int64_t rows) const { return cap > 0 ? std::min(rows, cap) : rows; }
  // The size this step runs at: the chosen one, within [1, Max(rows)].
  int64_t Clamp(int64_t rows) {
    size = std::clamp<int64_t>(size, 1, Max(rows));
    return size;
  }
  // The size a growth goes to: ×kGrowth, at least one more, at most Max(rows).
  int64_t Next(int64_t rows) const {
    const auto grown = static_cast<int64_t>(std::floor(static_cast<double>(size) * kGrowth));
    return std::min(std::max(grown, size + 1), Max(rows));
  }

  // Bounds it by a cap from elsewhere (the process's earlier out-of-memory; 0: none).
  void CapAt(int64_t other) {
    if (other > 0) cap = cap > 0 ? std::min(cap, other) : other;
  }
  // The ranks' agreement: the least size and the least cap of any (0 for a rank without one is
  // no bound, so it is passed as `no_cap`).
  void Agree(int64_t least_size, int64_t least_cap, int64_t no_cap) {
    size = least_size;
    cap = least_cap == no_cap ? 0 : least_cap;
  }

  // An out-of-memory every rank agreed on at `failed` (> 1): never that size again, and the
  // step runs again at about failed / kGrowth.
  void ShrinkAfterOutOfMemory(int64_t failed) {
    cap = failed - 1;
    size = std::max<int64_t>(
        1, static_cast<int64_t>(std::floor(static_cast<double>(failed) / kGrowth)));
    if (size == failed) size = failed - 1;
  }

  // This rank's memory verdicts after a step at `micro` (before the ranks sum them): whether
  // the next size is kept out (it is no larger, or its predicted peak passes `target` bytes) and
  // whether the peak is over the target now. The predicted peak scales what the micro-batch
  // added above `base_bytes` (what was resident before the step's first pass).
  struct Verdict {
    bool blocked = true;
    bool over = false;
  };
  static Verdict Judge(int64_t micro, int64_t next, int64_t base_bytes, int64_t peak_bytes,
                       double target) {
    const double per_row =
        static_cast<double>(peak_bytes - base_bytes) / static_cast<double>(micro);
    const double predicted = static_cast<double>(base_bytes) + per_row * static_cast<double>(next);
    return {.blocked = next <= micro || predicted > target,
            .over = micro > 1 && static_cast<double>(peak_bytes) > target};
  }
  // The ranks' verdicts on a step at `micro` (any rank blocked or over decides for all): the
  // size the next step runs at, and why it changed ("" when it did not).
  std::string After(int64_t micro, int64_t next, bool any_blocked, bool any_over) {
    if (any_over) {
      cap = micro - 1;
      size = std::max<int64_t>(1, micro - 1);
      return "peak over the memory target";
    }
    if (!any_blocked) {
      size = next;
      return "peak scaled to the next size stays under the memory target";
    }
    return "";
  }
};

}  // namespace tidal::engine
