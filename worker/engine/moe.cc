// worker/engine/moe.cc
#include "worker/engine/moe.h"

#include <limits>
#include <vector>

namespace tidal::engine {

MoeRouting RouteTokens(const MoeConfig& moe, const torch::Tensor& tokens,
                       const torch::Tensor& router, const torch::Tensor& correction_bias) {
  namespace F = torch::nn::functional;
  const int64_t n = tokens.size(0), experts = moe.n_routed_experts;
  auto logits = F::linear(tokens.to(torch::kFloat32), router.to(torch::kFloat32));
  const bool sigmoid = moe.sigmoid_scores();
  auto scores = sigmoid ? logits.sigmoid() : logits.softmax(-1);
  MoeRouting out;
  {
    // Which experts: a choice, not a value (no gradient flows through it).
    torch::NoGradGuard no_grad;
    auto choice = scores.detach();
    if (sigmoid && correction_bias.defined()) choice = choice + correction_bias.to(torch::kFloat32);
    if (moe.topk_method != "greedy") {
      const int64_t per_group = experts / moe.n_group;
      auto grouped = choice.view({n, moe.n_group, per_group});
      // noaux_tc ranks a group by the sum of its two best; group_limited_greedy by its best.
      auto group_scores = moe.topk_method == "noaux_tc" ? std::get<0>(grouped.topk(2, -1)).sum(-1)
                                                        : std::get<0>(grouped.max(-1));
      auto open = std::get<1>(group_scores.topk(moe.topk_group, -1, true, false));
      auto open_mask = torch::zeros_like(group_scores, torch::kBool)
                           .scatter_(1, open, true)
                           .unsqueeze(-1)
                           .expand({n, moe.n_group, per_group})
                           .reshape({n, experts});
      choice = choice.masked_fill(open_mask.logical_not(), -std::numeric_limits<float>::infinity());
    }
    out.experts = std::get<1>(choice.topk(moe.num_experts_per_tok, -1, true, false));
    out.expert_tokens =
        torch::bincount(out.experts.reshape({-1}), {}, experts).to(torch::kCPU, torch::kInt64);
  }
  // The weights: the unbiased scores of the chosen experts (softmax's values in V2, the
  // sigmoid's in V3), renormalised over the k when norm_topk_prob, then scaled.
  auto weights = scores.gather(1, out.experts);
  if (moe.norm_topk_prob) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  out.weights = weights * moe.routed_scaling_factor;
  return out;
}

torch::Tensor RunExperts(const torch::Tensor& tokens, const MoeRouting& routing, int64_t n_experts,
                         const ExpertFn& expert) {
  const int64_t k = routing.experts.size(1);
  torch::Tensor order, token_of;
  {
    torch::NoGradGuard no_grad;
    // Every (token, slot) pair, sorted by its expert: expert e's tokens are one contiguous run.
    order = std::get<1>(routing.experts.reshape({-1}).sort(std::optional<bool>(true), 0));
    token_of = order.div(k, "floor");
  }
  // One split (its backward is one concatenation), not a narrow per expert (each of whose
  // backwards would fill a zero tensor of every row).
  const auto counts = routing.expert_tokens.accessor<int64_t, 1>();
  std::vector<int64_t> sizes(static_cast<size_t>(n_experts));
  for (int64_t e = 0; e < n_experts; ++e) sizes[static_cast<size_t>(e)] = counts[e];
  auto groups = tokens.index_select(0, token_of).split_with_sizes(sizes);
  std::vector<torch::Tensor> outputs;
  for (int64_t e = 0; e < n_experts; ++e)
    if (counts[e] > 0) outputs.push_back(expert(e, groups[static_cast<size_t>(e)]));
  auto weights = routing.weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  // Weighted in fp32 as transformers does, added back in the activations' dtype.
  auto weighted = (torch::cat(outputs) * weights).to(tokens.scalar_type());
  return torch::zeros_like(tokens).index_add(0, token_of, weighted);
}

torch::Tensor ExpertMlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down, const ExpertLora& lora) {
  namespace F = torch::nn::functional;
  const bool adjacent = !gate.requires_grad() && !up.requires_grad() && gate.is_contiguous() &&
                        up.is_contiguous() && gate.dim() == 2 && up.sizes() == gate.sizes() &&
                        gate.scalar_type() == up.scalar_type() &&
                        gate.storage().is_alias_of(up.storage()) &&
                        up.storage_offset() == gate.storage_offset() + gate.numel();
  torch::Tensor g, u;
  if (adjacent) {
    auto both = gate.as_strided({2 * gate.size(0), gate.size(1)}, {gate.size(1), 1});
    auto halves = F::linear(x, both).chunk(2, -1);
    g = halves[0], u = halves[1];
  } else {
    g = F::linear(x, gate), u = F::linear(x, up);
  }
  if (lora.gate_up_a.defined()) {
    auto delta =
        (F::linear(F::linear(x, lora.gate_up_a), lora.gate_up_b) * lora.scale).chunk(2, -1);
    g = g + delta[0], u = u + delta[1];
  }
  auto hidden = F::silu(g) * u;
  auto out = F::linear(hidden, down);
  if (!lora.down_a.defined()) return out;
  return out + F::linear(F::linear(hidden, lora.down_a), lora.down_b) * lora.scale;
}

}  // namespace tidal::engine
