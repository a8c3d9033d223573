// worker/engine/memory_plan.cc
#include "worker/engine/memory_plan.h"

#include <algorithm>
#include <cmath>

namespace tidal::engine {

std::vector<BlockCounts> BlockParameterCounts(const ModelConfig& model, const LoraSpec& lora) {
  const int64_t h = model.hidden_size;
  std::vector<BlockCounts> blocks;
  blocks.push_back({model.vocab_size * h, 0});
  // LoRA per layer: r · (in + out) for each targeted projection the layer has. A MoE layer's
  // routed experts hold one adapter per fused parameter, rank r per expert (2r for gate_up).
  const bool moe = model.moe.n_routed_experts > 0;
  auto adapters = [&](int64_t layer) {
    int64_t n = 0;
    for (const std::string& m : lora.target_modules) {
      const bool mlp = m == "gate_proj" || m == "up_proj" || m == "down_proj";
      if (mlp && moe) continue;
      for (const auto& [out, in] : model.ProjectionShapes(m)) n += lora.rank * (out + in);
    }
    if (moe && model.IsMoeLayer(layer)) {
      const int64_t experts = model.moe.n_routed_experts, h = model.hidden_size,
                    inter = model.moe.moe_intermediate_size;
      const auto targeted = [&](const char* m) {
        return std::find(lora.target_modules.begin(), lora.target_modules.end(), m) !=
               lora.target_modules.end();
      };
      if (targeted("gate_proj")) n += 2 * lora.rank * experts * (h + 2 * inter);
      if (targeted("down_proj")) n += lora.rank * experts * (inter + h);
    }
    return n;
  };
  for (int64_t l = 0; l < model.num_hidden_layers; ++l)
    blocks.push_back({model.LayerParameterCount(l), adapters(l)});
  blocks.push_back({h * (model.tie_word_embeddings ? 1 : 1 + model.vocab_size), 0});
  return blocks;
}

nlohmann::json MemoryPlan::ToJson() const {
  auto gib = [](int64_t bytes) { return std::round(bytes / 1073741824.0 * 1000) / 1000; };
  return {{"params_total", params_total},
          {"params_active", params_active},
          {"params_trainable", params_trainable},
          {"world_size", world_size},
          {"zero_stage", zero_stage},
          {"micro_batch", micro_batch},
          {"seq_len", seq_len},
          {"per_rank_bytes",
           {{"resident_params", resident_param_bytes},
            {"optimizer", optimizer_bytes},
            {"gradients", gradient_bytes},
            {"gathered_block", gathered_block_bytes},
            {"activations_estimate", activation_bytes},
            {"total", total_bytes}}},
          {"per_rank_gib", gib(total_bytes)}};
}

MemoryPlan PlanMemory(const ModelConfig& model, const LoraSpec& lora, int zero_stage,
                      int world_size, int64_t micro_batch, int64_t seq_len, int compute_bytes) {
  MemoryPlan plan;
  plan.params_total = model.BaseParameterCount();
  plan.params_active = model.ActiveParameterCount();
  plan.world_size = world_size, plan.zero_stage = zero_stage;
  plan.micro_batch = micro_batch, plan.seq_len = seq_len;
  const int64_t w = world_size;
  const bool sharded = zero_stage == 3;
  int64_t trainable_share = 0, trainable_full = 0;
  for (const BlockCounts& b : BlockParameterCounts(model, lora)) {
    plan.params_trainable += b.trainable;
    const int64_t frozen_padded = (b.frozen + w - 1) / w * w;
    const int64_t trainable_padded = (b.trainable + w - 1) / w * w;
    plan.resident_param_bytes += (sharded ? frozen_padded / w : frozen_padded) * compute_bytes +
                                 (sharded ? trainable_padded / w : trainable_padded) * 4;
    trainable_share += trainable_padded / w;
    trainable_full += trainable_padded;
    if (sharded)
      plan.gathered_block_bytes =
          std::max(plan.gathered_block_bytes, b.frozen * compute_bytes + b.trainable * 4);
  }
  plan.optimizer_bytes = 2 * 4 * (zero_stage >= 1 ? trainable_share : trainable_full);
  // The step's gradient is summed in fp64 (zero.cc: the same at any world size): a slice at
  // stages 2–3, everything at 0–1; below stage 3 autograd also fills one fp32 micro-batch's.
  const int64_t summed = zero_stage >= 2 ? trainable_share : trainable_full;
  plan.gradient_bytes = 8 * summed + (sharded ? 0 : 4 * trainable_full);

  // Activations (estimate): every block's input is kept for backward; one block at a time is
  // recomputed with its graph; the head's logits and their gradient are fp32.
  const int64_t tokens = micro_batch * seq_len, h = model.hidden_size;
  const int64_t saved_inputs = (model.num_hidden_layers + 2) * tokens * h * compute_bytes;
  const int64_t heads = model.num_attention_heads;
  const int64_t qk = model.uses_mla() ? model.mla.qk_head_dim() : model.head_dim();
  const int64_t v = model.uses_mla() ? model.mla.v_head_dim : model.head_dim();
  const int64_t attention = tokens * heads * (2 * qk + v) * compute_bytes * 2 +
                            micro_batch * heads * seq_len * seq_len * 4;  // scores, fp32
  int64_t mlp = tokens * model.intermediate_size * 4 * compute_bytes;
  if (model.moe.n_routed_experts > 0) {
    const int64_t routed = tokens * model.moe.num_experts_per_tok;
    mlp =
        std::max(mlp, (routed * (h + 4 * model.moe.moe_intermediate_size) +
                       tokens * model.moe.n_shared_experts * model.moe.moe_intermediate_size * 4) *
                              compute_bytes +
                          tokens * model.moe.n_routed_experts * 4 * 2);  // router scores
  }
  const int64_t logits = tokens * model.vocab_size * 4 * 3;
  plan.activation_bytes = saved_inputs + std::max(attention + mlp, logits);
  plan.total_bytes = plan.resident_param_bytes + plan.optimizer_bytes + plan.gradient_bytes +
                     plan.gathered_block_bytes + plan.activation_bytes;
  return plan;
}

}  // namespace tidal::engine
