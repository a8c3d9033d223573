// worker/engine/step_record.h — what one optimizer step reports. Plain data, no LibTorch, so
// the worker's control service and the launchers can hold it.
#pragma once

#include <cstdint>
#include <vector>

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
  int64_t micro_batch = 0;         // rows per forward pass this step ran at
  int64_t peak_memory_bytes = -1;  // microBatchSize auto: this rank's peak (MemoryMeter)
  bool skipped = false;  // fp16 overflow: the update was skipped and the loss scale lowered
  // Gradient traffic: whether the step was compressed (spec.optimization.gradientCompression,
  // after its dense warm-up), the bytes this rank handed to its gradient collectives, the time
  // it spent selecting top-k entries, and how long the step's reduction waited for exchanges
  // backward did not hide.
  bool compressed = false;
  int64_t gradient_bytes = 0;
  double compress_seconds = 0;
  double exchange_wait_seconds = 0;
  // Mixture of experts: for each MoE layer (`moe_layers`, ascending), the tokens routed to
  // each expert over the step's global batch (all ranks; a token counts once per expert it
  // chose). Empty for a dense model.
  std::vector<int64_t> moe_layers;
  std::vector<std::vector<int64_t>> expert_tokens;

  // Per MoE layer: the busiest expert's tokens over the mean (1 = perfectly balanced).
  std::vector<double> MoeImbalance() const {
    std::vector<double> out;
    for (const auto& counts : expert_tokens) {
      int64_t total = 0, busiest = 0;
      for (int64_t c : counts) total += c, busiest = c > busiest ? c : busiest;
      out.push_back(total == 0 ? 1.0
                               : static_cast<double>(busiest) * static_cast<double>(counts.size()) /
                                     static_cast<double>(total));
    }
    return out;
  }
};

}  // namespace tidal::engine
