// worker/engine/memory_plan.h — what one rank needs in memory for a job, before anything is
// allocated (`tidal-train --dry-run`): the parameter slices ZeRO keeps (exactly what the
// engine allocates: the same blocks, the same padding), the optimizer state and gradients, the
// largest block gathered whole, and an estimate of the activations. No LibTorch here.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/train_config.h"
#include "worker/engine/model_config.h"

namespace tidal::engine {

// Parameters per block in the engine's layout (worker/engine/model.h): embedding, each decoder
// layer, head; frozen (the base) and trainable (LoRA).
struct BlockCounts {
  int64_t frozen = 0, trainable = 0;
};
std::vector<BlockCounts> BlockParameterCounts(const ModelConfig& model, const LoraSpec& lora);

struct MemoryPlan {
  int64_t params_total = 0, params_active = 0, params_trainable = 0;
  int world_size = 1, zero_stage = 3;
  int64_t micro_batch = 1, seq_len = 0;
  // Exact: what ShardedParameters allocates on this rank (frozen in the compute dtype,
  // trainable in fp32, each block's flat padded to a multiple of the world size).
  int64_t resident_param_bytes = 0;
  int64_t optimizer_bytes = 0;       // AdamW's two fp32 moments of the rank's trainable share
  int64_t gradient_bytes = 0;        // fp32 gradients the rank keeps
  int64_t gathered_block_bytes = 0;  // stage 3: the largest block gathered whole (else 0)
  // Estimates: each block's saved input, one block's recompute (attention scores, MLP or
  // experts' intermediates) and the logits with their gradient in fp32.
  int64_t activation_bytes = 0;
  int64_t total_bytes = 0;

  nlohmann::json ToJson() const;
};

// `compute_bytes`: 4 for fp32, 2 for bf16 / fp16.
MemoryPlan PlanMemory(const ModelConfig& model, const LoraSpec& lora, int zero_stage,
                      int world_size, int64_t micro_batch, int64_t seq_len, int compute_bytes);

}  // namespace tidal::engine
