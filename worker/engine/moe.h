// worker/engine/moe.h — the mixture-of-experts layer's two halves, as DeepSeek-V2/V3 compute
// them (transformers' DeepseekV2TopkRouter / DeepseekV3TopkRouter and their Experts): routing
// each token to num_experts_per_tok experts, and running the experts grouped — the token copies
// sorted by expert, one matmul chain per expert over all its tokens, never a loop over tokens.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/torch.h>

#include "worker/engine/model_config.h"

namespace tidal::engine {

struct MoeRouting {
  torch::Tensor experts;        // [tokens, k] int64: the chosen experts
  torch::Tensor weights;        // [tokens, k] fp32: their gate weights (normalised, scaled)
  torch::Tensor expert_tokens;  // [n_routed_experts] int64 on the CPU: tokens per expert
};

// Scores (softmax for V2, sigmoid for V3), group-limited choice (group_limited_greedy: groups
// ranked by their best score, the rest scored 0; noaux_tc: by the sum of their two best
// scores after e_score_correction_bias, the rest -inf), top-k, then norm_topk_prob and
// routed_scaling_factor. `tokens` [n, hidden]; `router` [experts, hidden]; `correction_bias`
// [experts] (noaux_tc) or undefined. Scores are computed in fp32; the weights carry the
// gradient to `tokens`.
MoeRouting RouteTokens(const MoeConfig& moe, const torch::Tensor& tokens,
                       const torch::Tensor& router, const torch::Tensor& correction_bias);

// Σ_k weight · expert(token) per token: copies of the tokens sorted by expert, `expert(e, x)`
// run once per expert that received any, the results weighted and added back per token.
using ExpertFn = std::function<torch::Tensor(int64_t expert, const torch::Tensor& tokens)>;
torch::Tensor RunExperts(const torch::Tensor& tokens, const MoeRouting& routing, int64_t n_experts,
                         const ExpertFn& expert);

// One expert's LoRA adapters, when targeted: gate_up_a [2r, hidden] and gate_up_b [2·inter, 2r]
// adapt gate and up as one fused projection (gate's outputs first), down_a [r, inter] and
// down_b [hidden, r] the down projection; each delta is scaled by `scale`.
struct ExpertLora {
  torch::Tensor gate_up_a, gate_up_b, down_a, down_b;
  double scale = 1;
};

// One expert's SwiGLU, down(silu(gate(x)) · up(x)), plus its adapters' terms. When gate and up
// lie back to back in memory (as ZeRO's flat block layout puts them) and are frozen, they are
// one [2·inter, hidden] matrix and one GEMM.
torch::Tensor ExpertMlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down, const ExpertLora& lora = {});

}  // namespace tidal::engine
