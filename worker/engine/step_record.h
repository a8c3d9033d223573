// worker/engine/step_record.h — what one optimizer step reports. Plain data, no LibTorch, so
// the worker's control service and the launchers can hold it.
#pragma once

#include <cstdint>

namespace tidal::engine {

struct StepRecord {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0;   // mean token loss over the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_s = 0;
  double seconds = 0;
  double data_wait_seconds =
      0;  // of `seconds`: reading micro-batches and moving them to the device
  int world_size = 1;
  bool skipped = false;  // fp16 overflow: the update was skipped and the loss scale lowered
};

}  // namespace tidal::engine
