// worker/engine/model.cc
#include "worker/engine/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>

#include "worker/engine/moe.h"
#include "worker/engine/torch_compat.h"

namespace tidal::engine {
namespace {

namespace F = torch::nn::functional;

// The projections of a decoder layer. The id keys LoRA dropout masks, so the numbering up to
// kSharedDown is part of the numerics: do not renumber it. Routed expert e's gate/up/down are
// kExpert + 3e + 0/1/2 (never adapted one by one, so never masked: their ids may move).
enum ModuleId : size_t {
  kQ = 0,
  kK,
  kV,
  kO,
  kGate,
  kUp,
  kDown,  // dense families (and MLA's q_proj, o_proj)
  kQA,
  kQB,
  kKVA,
  kKVB,  // MLA
  kSharedGate,
  kSharedUp,
  kSharedDown,     // MoE layers' shared experts
  kExpertsGateUp,  // the routed experts' adapters, all experts in one (as PEFT's ParamWrapper)
  kExpertsDown,
  kExpert,
};

// PEFT's name of each projection (what spec.lora.targetModules lists) and its path in a layer.
struct ModuleName {
  const char* target;
  const char* path;
};
ModuleName NameOf(size_t id) {
  static const ModuleName kNames[] = {
      {"q_proj", "self_attn.q_proj"},
      {"k_proj", "self_attn.k_proj"},
      {"v_proj", "self_attn.v_proj"},
      {"o_proj", "self_attn.o_proj"},
      {"gate_proj", "mlp.gate_proj"},
      {"up_proj", "mlp.up_proj"},
      {"down_proj", "mlp.down_proj"},
      {"q_a_proj", "self_attn.q_a_proj"},
      {"q_b_proj", "self_attn.q_b_proj"},
      {"kv_a_proj_with_mqa", "self_attn.kv_a_proj_with_mqa"},
      {"kv_b_proj", "self_attn.kv_b_proj"},
      {"gate_proj", "mlp.shared_experts.gate_proj"},
      {"up_proj", "mlp.shared_experts.up_proj"},
      {"down_proj", "mlp.shared_experts.down_proj"},
  };
  return kNames[id];
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // As HF LlamaRMSNorm: normalise in fp32, scale in the input dtype.
  auto x32 = x.to(torch::kFloat32);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  // x: [batch, heads, seq, head_dim]; cos/sin: [seq, head_dim] or [batch, 1, seq, head_dim].
  auto c = cos.to(x.scalar_type());
  auto s = sin.to(x.scalar_type());
  return x * c + RotateHalf(x) * s;
}

}  // namespace

uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

DecoderModel::DecoderModel(ModelConfig config, LoraSpec lora)
    : config_(std::move(config)), lora_(std::move(lora)) {
  lora_scale_ = lora_.alpha / static_cast<double>(lora_.rank);
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  auto targeted = [&](const std::string& m) {
    return std::find(lora_.target_modules.begin(), lora_.target_modules.end(), m) !=
           lora_.target_modules.end();
  };
  blocks_.push_back(
      {BlockKind::kEmbedding, -1, {{"model.embed_tokens.weight", {c.vocab_size, h}}}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    BlockSpec block{BlockKind::kDecoderLayer, l, {}};
    std::vector<ParamRole> roles;
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& name, std::vector<int64_t> shape, ParamRole role) {
      block.params.push_back({layer + name, std::move(shape)});
      roles.push_back(role);
    };
    // A projection: weight, bias when it has one, and the adapter when targeted.
    auto projection = [&](size_t id, int64_t out, int64_t in, bool bias) {
      const bool expert = id >= kExpert;
      const std::string path =
          expert ? "mlp.experts." + std::to_string((id - kExpert) / 3) + "." +
                       std::array{"gate_proj", "up_proj", "down_proj"}[(id - kExpert) % 3]
                 : NameOf(id).path;
      add(path + ".weight", {out, in}, {ParamRole::kWeight, id});
      if (bias) add(path + ".bias", {out}, {ParamRole::kBias, id});
      // LoRA reaches what PEFT's target_modules reach: with experts, gate/up/down_proj name
      // the routed experts (below), not the dense layers' or the shared experts' MLPs.
      const bool adaptable = !expert && id < kSharedGate &&
                             !(c.moe.n_routed_experts > 0 && id >= kGate && id <= kDown);
      if (adaptable && targeted(NameOf(id).target)) {
        block.params.push_back({layer + path + ".lora_A.weight", {lora_.rank, in}, true});
        roles.push_back({ParamRole::kLoraA, id});
        block.params.push_back({layer + path + ".lora_B.weight", {out, lora_.rank}, true});
        roles.push_back({ParamRole::kLoraB, id});
      }
    };
    add("input_layernorm.weight", {h}, {ParamRole::kInputNorm});
    if (c.uses_mla()) {
      const MlaConfig& m = c.mla;
      const int64_t heads = c.num_attention_heads;
      if (m.q_lora_rank == 0) {
        projection(kQ, heads * m.qk_head_dim(), h, false);
      } else {
        projection(kQA, m.q_lora_rank, h, c.o_bias);
        add("self_attn.q_a_layernorm.weight", {m.q_lora_rank}, {ParamRole::kQANorm});
        projection(kQB, heads * m.qk_head_dim(), m.q_lora_rank, false);
      }
      projection(kKVA, m.kv_lora_rank + m.qk_rope_head_dim, h, c.o_bias);
      add("self_attn.kv_a_layernorm.weight", {m.kv_lora_rank}, {ParamRole::kKVANorm});
      projection(kKVB, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, false);
      projection(kO, h, heads * m.v_head_dim, c.o_bias);
    } else {
      const int64_t q = c.num_attention_heads * c.head_dim(),
                    kv = c.num_key_value_heads * c.head_dim();
      projection(kQ, q, h, c.qkv_bias);
      projection(kK, kv, h, c.qkv_bias);
      projection(kV, kv, h, c.qkv_bias);
      if (c.qk_norm) {  // Qwen3: per-head RMSNorm of q and k
        add("self_attn.q_norm.weight", {c.head_dim()}, {ParamRole::kQNorm});
        add("self_attn.k_norm.weight", {c.head_dim()}, {ParamRole::kKNorm});
      }
      projection(kO, h, q, c.o_bias);
    }
    add("post_attention_layernorm.weight", {h}, {ParamRole::kPostNorm});
    if (!c.IsMoeLayer(l)) {
      projection(kGate, c.intermediate_size, h, c.mlp_bias);
      projection(kUp, c.intermediate_size, h, c.mlp_bias);
      projection(kDown, h, c.intermediate_size, c.mlp_bias);
    } else {
      const MoeConfig& moe = c.moe;
      const int64_t experts = moe.n_routed_experts, inter = moe.moe_intermediate_size;
      add("mlp.gate.weight", {experts, h}, {ParamRole::kRouter});
      if (moe.sigmoid_scores())
        add("mlp.gate.e_score_correction_bias", {experts}, {ParamRole::kRouterBias});
      for (int64_t e = 0; e < experts; ++e) {
        projection(kExpert + 3 * e, inter, h, false);
        projection(kExpert + 3 * e + 1, inter, h, false);
        projection(kExpert + 3 * e + 2, h, inter, false);
      }
      // The routed experts' adapters, laid out as PEFT's ParamWrapper over transformers'
      // fused [experts, out, in] parameters: A [rank · experts, in] is expert-major (expert
      // e's rows e·rank …), B [out, rank · experts] rank-major (expert e's columns j·experts +
      // e). gate and up are one [2·inter, hidden] parameter with rank 2r (and alpha 2α, so the
      // same scale).
      auto experts_adapter = [&](size_t id, const std::string& name, int64_t rank, int64_t out,
                                 int64_t in) {
        const std::string path = layer + "mlp.experts." + name;
        block.params.push_back({path + ".lora_A.weight", {rank * experts, in}, true});
        roles.push_back({ParamRole::kLoraA, id});
        block.params.push_back({path + ".lora_B.weight", {out, rank * experts}, true});
        roles.push_back({ParamRole::kLoraB, id});
      };
      if (targeted("gate_proj") && targeted("up_proj"))
        experts_adapter(kExpertsGateUp, "gate_up_proj", 2 * lora_.rank, 2 * inter, h);
      if (targeted("down_proj")) experts_adapter(kExpertsDown, "down_proj", lora_.rank, h, inter);
      if (moe.n_shared_experts > 0) {
        const int64_t shared = inter * moe.n_shared_experts;
        const bool bias = c.mlp_bias && c.model_type == "deepseek_v2";
        projection(kSharedGate, shared, h, bias);
        projection(kSharedUp, shared, h, bias);
        projection(kSharedDown, h, shared, bias);
      }
    }
    layer_roles_.push_back(std::move(roles));
    blocks_.push_back(std::move(block));
  }
  BlockSpec head{BlockKind::kHead, -1, {{"model.norm.weight", {h}}}};
  if (!c.tie_word_embeddings) head.params.push_back({"lm_head.weight", {c.vocab_size, h}});
  blocks_.push_back(std::move(head));
}

namespace {

// The inverse frequencies of config.rope, step by step as transformers' modeling_rope_utils
// computes them (fp32 tensors).
torch::Tensor InverseFrequencies(const ModelConfig& config, torch::Device device) {
  const int64_t dim = config.RopeDim();
  const RopeScaling& rope = config.rope;
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto pos_freqs = torch::pow(config.rope_theta, torch::arange(0, dim, 2, opts) / dim);
  auto inv_freq = 1.0 / pos_freqs;
  const double original = rope.original_max_position_embeddings > 0
                              ? static_cast<double>(rope.original_max_position_embeddings)
                              : static_cast<double>(config.max_position_embeddings);
  if (rope.type == "linear") return inv_freq / rope.factor;
  if (rope.type == "llama3") {
    const double low_wavelen = original / rope.low_freq_factor;
    const double high_wavelen = original / rope.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq);
    auto smooth = (original / wavelen - rope.low_freq_factor) /
                  (rope.high_freq_factor - rope.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    return torch::where(medium, smoothed, scaled);
  }
  if (rope.type == "yarn") {
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(original / (rotations * 2 * M_PI))) /
             (2 * std::log(config.rope_theta));
    };
    double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
    if (rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // as transformers: no division by zero
    auto ramp = ((torch::arange(dim / 2, opts) - low) / (high - low)).clamp(0, 1);
    auto extrapolation = 1 - ramp;
    auto interpolation = 1.0 / (rope.factor * pos_freqs);
    return interpolation * (1 - extrapolation) + inv_freq * extrapolation;
  }
  return inv_freq;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> DecoderModel::RopeTables(int64_t seq,
                                                                 torch::Device device) const {
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto freqs = torch::outer(torch::arange(seq, opts), InverseFrequencies(config_, device));
  auto emb = torch::cat({freqs, freqs}, -1);
  const double scaling = config_.RopeAttentionScaling();  // yarn's attention factor
  if (scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * scaling, emb.sin() * scaling};
}

torch::Tensor DecoderModel::InitialValue(const ParamSpec& spec, uint64_t seed) const {
  auto gen = compat::MakeGenerator(MixSeed(seed, HashName(spec.name)), torch::kCPU);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  const std::string& n = spec.name;
  auto ends_with = [&](const std::string& suffix) {
    return n.size() >= suffix.size() &&
           n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("norm.weight")) return torch::ones(spec.shape, opts);
  if (ends_with(".bias") || ends_with("e_score_correction_bias"))
    return torch::zeros(spec.shape, opts);
  if (ends_with("lora_B.weight")) return torch::zeros(spec.shape, opts);
  if (ends_with("lora_A.weight")) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
    return torch::empty(spec.shape, opts).uniform_(-bound, bound, gen);
  }
  return torch::empty(spec.shape, opts).normal_(0.0, config_.initializer_range, gen);
}

torch::Tensor DecoderModel::ForwardBlock(int64_t b, const std::vector<torch::Tensor>& params,
                                         const torch::Tensor& x, const ForwardContext& ctx,
                                         const torch::Tensor& embedding) const {
  const BlockSpec& block = blocks_.at(b);
  switch (block.kind) {
    case BlockKind::kEmbedding:
      return F::embedding(ctx.tokens, params[0]);
    case BlockKind::kDecoderLayer:
      return DecoderLayer(block.layer, params, x, ctx);
    case BlockKind::kHead: {
      auto h = RmsNorm(x, params[0], config_.rms_norm_eps);
      const torch::Tensor& lm_head = config_.tie_word_embeddings ? embedding : params[1];
      auto logits = F::linear(h, lm_head);
      if (!ctx.targets.defined()) return logits;
      if (ctx.row_loss_weights.defined()) {
        auto per_token = F::cross_entropy(
            logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), ctx.targets.reshape({-1}),
            F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kNone));
        return (per_token.view(ctx.targets.sizes()).sum(1) * ctx.row_loss_weights).sum();
      }
      return F::cross_entropy(
          logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), ctx.targets.reshape({-1}),
          F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    }
  }
  return {};
}

namespace {

// Rotary pairs laid out (x0, x1), (x2, x3)… (DeepSeek) regrouped as (x0, x2, …, x1, x3, …), so
// that the rotate-half RoPE rotates each pair by its own frequency. q and k are regrouped
// alike, which leaves every q·k product as DeepSeek computes it.
torch::Tensor Deinterleave(const torch::Tensor& x) {
  auto pairs = x.unflatten(-1, {x.size(-1) / 2, 2});
  return torch::cat({pairs.select(-1, 0), pairs.select(-1, 1)}, -1);
}

}  // namespace

torch::Tensor DecoderModel::DecoderLayer(int64_t layer, const std::vector<torch::Tensor>& p,
                                         const torch::Tensor& x, const ForwardContext& ctx) const {
  const bool dropout = ctx.training && lora_.dropout > 0;
  const uint64_t layer_key = MixSeed(ctx.dropout_key, static_cast<uint64_t>(layer));
  const ModelConfig& c = config_;

  // Each projection with its bias and adapter when it has them (layer_roles_ says which
  // parameter is what).
  struct Linear {
    torch::Tensor weight, bias, lora_a, lora_b;
  };
  std::map<size_t, Linear> mods;
  torch::Tensor input_norm, post_norm, q_norm, k_norm, q_a_norm, kv_a_norm, router, router_bias;
  const std::vector<ParamRole>& roles = layer_roles_.at(layer);
  for (size_t i = 0; i < p.size(); ++i) {
    const ParamRole& role = roles.at(i);
    switch (role.kind) {
      case ParamRole::kInputNorm:
        input_norm = p[i];
        break;
      case ParamRole::kPostNorm:
        post_norm = p[i];
        break;
      case ParamRole::kQNorm:
        q_norm = p[i];
        break;
      case ParamRole::kKNorm:
        k_norm = p[i];
        break;
      case ParamRole::kQANorm:
        q_a_norm = p[i];
        break;
      case ParamRole::kKVANorm:
        kv_a_norm = p[i];
        break;
      case ParamRole::kRouter:
        router = p[i];
        break;
      case ParamRole::kRouterBias:
        router_bias = p[i];
        break;
      case ParamRole::kWeight:
        mods[role.module].weight = p[i];
        break;
      case ParamRole::kBias:
        mods[role.module].bias = p[i];
        break;
      case ParamRole::kLoraA:
        mods[role.module].lora_a = p[i];
        break;
      case ParamRole::kLoraB:
        mods[role.module].lora_b = p[i];
        break;
    }
  }
  auto linear = [&](size_t m, const torch::Tensor& in) {
    const Linear& l = mods.at(m);
    auto out = F::linear(in, l.weight, l.bias);
    if (!l.lora_a.defined()) return out;
    torch::Tensor lora_in = in;
    if (dropout && !ctx.row_dropout_keys.empty()) {
      std::vector<torch::Tensor> keep;
      for (size_t r = 0; r < ctx.row_dropout_keys.size(); ++r) {
        const uint64_t row_layer = MixSeed(ctx.row_dropout_keys[r], static_cast<uint64_t>(layer));
        auto gen = compat::MakeGenerator(MixSeed(row_layer, m), in.device());
        keep.push_back(torch::empty_like(in.narrow(0, static_cast<int64_t>(r), 1))
                           .bernoulli_(1.0 - lora_.dropout, gen));
      }
      lora_in = in * torch::cat(keep).div_(1.0 - lora_.dropout);
    } else if (dropout) {
      auto gen = compat::MakeGenerator(MixSeed(layer_key, m), in.device());
      auto keep = torch::empty_like(in).bernoulli_(1.0 - lora_.dropout, gen);
      lora_in = in * keep.div_(1.0 - lora_.dropout);
    }
    return out + F::linear(F::linear(lora_in, l.lora_a), l.lora_b) * lora_scale_;
  };

  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = c.num_attention_heads;
  const double eps = c.rms_norm_eps;
  const bool per_token = ctx.rope_cos.dim() == 4;
  auto cos = per_token ? ctx.rope_cos : ctx.rope_cos.narrow(0, 0, seq);
  auto sin = per_token ? ctx.rope_sin : ctx.rope_sin.narrow(0, 0, seq);
  auto attend = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    std::optional<double> scale) {
    return ctx.attention.defined() ? compat::MaskedAttention(q, k, v, ctx.attention, scale)
                                   : compat::CausalAttention(q, k, v, scale);
  };
  auto h = RmsNorm(x, input_norm, eps);
  torch::Tensor attn;
  if (c.uses_mla()) {
    // Multi-head latent attention (transformers' DeepseekV2Attention / DeepseekV3Attention).
    const MlaConfig& m = c.mla;
    auto q =
        m.q_lora_rank == 0 ? linear(kQ, h) : linear(kQB, RmsNorm(linear(kQA, h), q_a_norm, eps));
    q = q.view({batch, seq, heads, m.qk_head_dim()}).transpose(1, 2);
    auto q_nope = q.narrow(-1, 0, m.qk_nope_head_dim);
    auto q_rot = q.narrow(-1, m.qk_nope_head_dim, m.qk_rope_head_dim);
    auto latent = linear(kKVA, h);  // [batch, seq, kv_lora_rank + qk_rope_head_dim]
    auto kv = RmsNorm(latent.narrow(-1, 0, m.kv_lora_rank), kv_a_norm, eps);
    auto k_rot = latent.narrow(-1, m.kv_lora_rank, m.qk_rope_head_dim)
                     .view({batch, 1, seq, m.qk_rope_head_dim});
    if (m.rope_interleave) {
      q_rot = Deinterleave(q_rot);
      k_rot = Deinterleave(k_rot);
    }
    q_rot = ApplyRope(q_rot, cos, sin);
    k_rot = ApplyRope(k_rot, cos, sin);
    auto kv_heads = linear(kKVB, kv)
                        .view({batch, seq, heads, m.qk_nope_head_dim + m.v_head_dim})
                        .transpose(1, 2);
    auto k_nope = kv_heads.narrow(-1, 0, m.qk_nope_head_dim);
    auto v = kv_heads.narrow(-1, m.qk_nope_head_dim, m.v_head_dim);
    auto query = torch::cat({q_nope, q_rot}, -1);
    auto key = torch::cat({k_nope, k_rot.expand({batch, heads, seq, m.qk_rope_head_dim})}, -1);
    attn = attend(query, key, v, c.AttentionSoftmaxScale())
               .transpose(1, 2)
               .reshape({batch, seq, heads * m.v_head_dim});
  } else {
    const int64_t kv_heads = c.num_key_value_heads, dim = c.head_dim();
    auto q = linear(kQ, h).view({batch, seq, heads, dim});
    auto k = linear(kK, h).view({batch, seq, kv_heads, dim});
    if (c.qk_norm) {  // over each head's features, before RoPE (Qwen3)
      q = RmsNorm(q, q_norm, eps);
      k = RmsNorm(k, k_norm, eps);
    }
    q = ApplyRope(q.transpose(1, 2), cos, sin);
    k = ApplyRope(k.transpose(1, 2), cos, sin);
    auto v = linear(kV, h).view({batch, seq, kv_heads, dim}).transpose(1, 2);
    if (kv_heads != heads) {  // grouped-query attention: each kv head serves heads/kv_heads
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    attn = attend(q, k, v, std::nullopt).transpose(1, 2).reshape({batch, seq, heads * dim});
  }
  auto hidden = x + linear(kO, attn);
  auto m = RmsNorm(hidden, post_norm, eps);
  if (!c.IsMoeLayer(layer))
    return hidden + linear(kDown, F::silu(linear(kGate, m)) * linear(kUp, m));

  // Mixture of experts: route each token, run every expert once over the tokens it got.
  const MoeConfig& moe = c.moe;
  auto tokens = m.reshape({-1, c.hidden_size});
  const MoeRouting routing = RouteTokens(moe, tokens, router, router_bias);
  if (ctx.moe) {
    ctx.moe->expert_tokens[layer] = routing.expert_tokens;
    if (ctx.moe->keep_choices) ctx.moe->choices[layer] = std::get<0>(routing.experts.sort(1));
  }
  // The routed experts' adapters, when targeted, cut per expert: A [r, in] and B [out, r] from
  // the constructor's layout (one reordering copy of B per forward). One unbind each — its
  // backward is one stack — not an index per expert, whose backwards would each fill a zero
  // tensor of the whole adapter (E² work over a layer's experts).
  const int64_t experts = moe.n_routed_experts;
  std::vector<torch::Tensor> gate_up_a, gate_up_b, down_a, down_b;
  auto per_expert = [&](size_t id, std::vector<torch::Tensor>& a, std::vector<torch::Tensor>& b) {
    auto it = mods.find(id);
    if (it == mods.end()) return;
    a = it->second.lora_a.reshape({experts, -1, it->second.lora_a.size(1)}).unbind(0);
    b = it->second.lora_b.reshape({it->second.lora_b.size(0), -1, experts})
            .permute({2, 0, 1})
            .contiguous()
            .unbind(0);
  };
  per_expert(kExpertsGateUp, gate_up_a, gate_up_b);
  per_expert(kExpertsDown, down_a, down_b);
  auto routed = RunExperts(tokens, routing, experts, [&](int64_t e, const torch::Tensor& in) {
    const size_t id = kExpert + 3 * static_cast<size_t>(e);
    const auto i = static_cast<size_t>(e);
    ExpertLora lora;
    lora.scale = lora_scale_;
    if (!gate_up_a.empty()) lora.gate_up_a = gate_up_a[i], lora.gate_up_b = gate_up_b[i];
    if (!down_a.empty()) lora.down_a = down_a[i], lora.down_b = down_b[i];
    return ExpertMlp(in, mods.at(id).weight, mods.at(id + 1).weight, mods.at(id + 2).weight, lora);
  });
  auto out = routed.view_as(m);
  if (moe.n_shared_experts > 0)
    out = out + linear(kSharedDown, F::silu(linear(kSharedGate, m)) * linear(kSharedUp, m));
  return hidden + out;
}

StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> MergeLora(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const LoraSpec& lora,
    int64_t routed_experts, std::vector<std::string>* adapted) {
  if (lora.rank < 1) return InvalidArgument("merge: LoRA rank must be positive");
  std::map<std::string, torch::Tensor> by_name(named.begin(), named.end());
  const double scale = lora.alpha / static_cast<double>(lora.rank);
  std::vector<std::pair<std::string, torch::Tensor>> merged;
  const std::string kA = ".lora_A.weight", kB = ".lora_B.weight", kExperts = ".mlp.experts.";
  // (alpha / r) · B · A in fp32: the adapter's whole delta, or with `experts` its rows for
  // routed expert `expert` (PEFT's ParamWrapper layout, see the constructor: A [rank · experts,
  // in] expert-major, B [out, rank · experts] rank-major).
  auto delta = [&](const std::string& adapter, int64_t rank, int64_t experts,
                   int64_t expert) -> StatusOr<std::optional<torch::Tensor>> {
    auto a = by_name.find(adapter + kA), b = by_name.find(adapter + kB);
    if (a == by_name.end() || b == by_name.end()) return std::optional<torch::Tensor>();
    auto a32 = a->second.to(torch::kFloat32), b32 = b->second.to(torch::kFloat32);
    if (a32.dim() != 2 || b32.dim() != 2 || a32.size(0) != rank * experts ||
        b32.size(1) != rank * experts)
      return InvalidArgument("merge: " + adapter + " adapter is not [" +
                             std::to_string(rank * experts) + ", in] / [out, " +
                             std::to_string(rank * experts) + "]");
    if (experts == 1) return std::optional<torch::Tensor>(torch::matmul(b32, a32) * scale);
    auto a_e = a32.view({experts, rank, a32.size(1)})[expert];
    auto b_e = b32.view({b32.size(0), rank, experts}).select(2, expert);
    return std::optional<torch::Tensor>(torch::matmul(b_e, a_e) * scale);
  };
  for (const auto& [name, tensor] : named) {
    if (name.find(".lora_") != std::string::npos) continue;
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    TIDAL_ASSIGN_OR_RETURN(std::optional<torch::Tensor> d, delta(prefix, lora.rank, 1, 0));
    // "<layer>.mlp.experts.<e>.<gate|up|down>_proj": the expert's share of the fused adapters.
    const size_t at = prefix.find(kExperts);
    if (!d && routed_experts > 0 && at != std::string::npos) {
      const std::string rest = prefix.substr(at + kExperts.size());
      const size_t dot = rest.find('.');
      const std::string layer = prefix.substr(0, at) + kExperts;
      if (dot != std::string::npos && dot > 0 && dot <= 9 &&
          rest.find_first_not_of("0123456789") == dot) {
        const int64_t e = std::stoll(rest.substr(0, dot));
        const std::string projection = rest.substr(dot + 1);
        if (e >= routed_experts)
          return InvalidArgument("merge: " + name + " names expert " + std::to_string(e) + " of " +
                                 std::to_string(routed_experts));
        if (projection == "down_proj") {
          TIDAL_ASSIGN_OR_RETURN(d, delta(layer + "down_proj", lora.rank, routed_experts, e));
        } else if (projection == "gate_proj" || projection == "up_proj") {
          TIDAL_ASSIGN_OR_RETURN(d,
                                 delta(layer + "gate_up_proj", 2 * lora.rank, routed_experts, e));
          if (d) d = d->chunk(2, 0)[projection == "gate_proj" ? 0 : 1];
        }
      }
    }
    torch::Tensor out = tensor;
    if (d) {
      out = (tensor.to(torch::kFloat32) + *d).to(tensor.scalar_type());
      if (adapted) adapted->push_back(name);
    }
    merged.emplace_back(name, out);
  }
  return merged;
}

}  // namespace tidal::engine
