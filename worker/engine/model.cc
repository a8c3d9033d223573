// worker/engine/model.cc
#include "worker/engine/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "worker/engine/torch_compat.h"

namespace tidal::engine {
namespace {

namespace F = torch::nn::functional;

// The projections of one decoder layer in parameter order. Index i is the module id used to
// key dropout masks, so the order is part of the numerics: do not reorder.
const std::vector<std::string> kModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};
enum : size_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };

std::string ModulePrefix(int64_t layer, const std::string& module) {
  const bool attention =
      module == "q_proj" || module == "k_proj" || module == "v_proj" || module == "o_proj";
  return "model.layers." + std::to_string(layer) + (attention ? ".self_attn." : ".mlp.") + module;
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
  const int64_t h = config_.hidden_size;
  auto targeted = [&](const std::string& m) {
    return std::find(lora_.target_modules.begin(), lora_.target_modules.end(), m) !=
           lora_.target_modules.end();
  };
  auto has_bias = [&](size_t m) {
    return m <= kV ? config_.qkv_bias : m == kO ? config_.o_bias : config_.mlp_bias;
  };
  blocks_.push_back(
      {BlockKind::kEmbedding, -1, {{"model.embed_tokens.weight", {config_.vocab_size, h}}}});
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    BlockSpec block{BlockKind::kDecoderLayer, l, {}};
    const std::string layer = "model.layers." + std::to_string(l);
    auto add = [&](ParamSpec spec, ParamRole role) {
      block.params.push_back(std::move(spec));
      if (l == 0) layer_roles_.push_back(role);
    };
    add({layer + ".input_layernorm.weight", {h}}, {ParamRole::kInputNorm});
    for (size_t m = 0; m < kModules.size(); ++m) {
      if (m == kGate)
        add({layer + ".post_attention_layernorm.weight", {h}}, {ParamRole::kPostNorm});
      if (m == kO && config_.qk_norm) {  // Qwen3: per-head RMSNorm of q and k
        add({layer + ".self_attn.q_norm.weight", {config_.head_dim()}}, {ParamRole::kQNorm});
        add({layer + ".self_attn.k_norm.weight", {config_.head_dim()}}, {ParamRole::kKNorm});
      }
      const auto [out, in] = *config_.ProjectionShape(kModules[m]);
      const std::string prefix = ModulePrefix(l, kModules[m]);
      add({prefix + ".weight", {out, in}}, {ParamRole::kWeight, m});
      if (has_bias(m)) add({prefix + ".bias", {out}}, {ParamRole::kBias, m});
      if (targeted(kModules[m])) {
        add({prefix + ".lora_A.weight", {lora_.rank, in}, true}, {ParamRole::kLoraA, m});
        add({prefix + ".lora_B.weight", {out, lora_.rank}, true}, {ParamRole::kLoraB, m});
      }
    }
    blocks_.push_back(std::move(block));
  }
  BlockSpec head{BlockKind::kHead, -1, {{"model.norm.weight", {h}}}};
  if (!config_.tie_word_embeddings)
    head.params.push_back({"lm_head.weight", {config_.vocab_size, h}});
  blocks_.push_back(std::move(head));
}

namespace {

// The inverse frequencies of config.rope, step by step as transformers' modeling_rope_utils
// computes them (fp32 tensors).
torch::Tensor InverseFrequencies(const ModelConfig& config, torch::Device device) {
  const int64_t dim = config.head_dim();
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
  if (ends_with(".bias")) return torch::zeros(spec.shape, opts);
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
      return F::cross_entropy(
          logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), ctx.targets.reshape({-1}),
          F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    }
  }
  return {};
}

torch::Tensor DecoderModel::DecoderLayer(int64_t layer, const std::vector<torch::Tensor>& p,
                                         const torch::Tensor& x, const ForwardContext& ctx) const {
  const bool dropout = ctx.training && lora_.dropout > 0;
  const uint64_t layer_key = MixSeed(ctx.dropout_key, static_cast<uint64_t>(layer));

  // Each projection with its bias and adapter when it has them (layer_roles_ says which
  // parameter is what).
  struct Linear {
    torch::Tensor weight, bias, lora_a, lora_b;
  };
  std::array<Linear, 7> mods;
  torch::Tensor input_norm, post_norm, q_norm, k_norm;
  for (size_t i = 0; i < p.size(); ++i) {
    const ParamRole& role = layer_roles_.at(i);
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
    const Linear& l = mods[m];
    auto out = F::linear(in, l.weight, l.bias);
    if (!l.lora_a.defined()) return out;
    torch::Tensor lora_in = in;
    if (dropout) {
      auto gen = compat::MakeGenerator(MixSeed(layer_key, m), in.device());
      auto keep = torch::empty_like(in).bernoulli_(1.0 - lora_.dropout, gen);
      lora_in = in * keep.div_(1.0 - lora_.dropout);
    }
    return out + F::linear(F::linear(lora_in, l.lora_a), l.lora_b) * lora_scale_;
  };

  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t dim = config_.head_dim();
  const double eps = config_.rms_norm_eps;
  auto h = RmsNorm(x, input_norm, eps);
  auto q = linear(kQ, h).view({batch, seq, heads, dim});
  auto k = linear(kK, h).view({batch, seq, kv_heads, dim});
  if (config_.qk_norm) {  // over each head's features, before RoPE (Qwen3)
    q = RmsNorm(q, q_norm, eps);
    k = RmsNorm(k, k_norm, eps);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = linear(kV, h).view({batch, seq, kv_heads, dim}).transpose(1, 2);
  const bool per_token = ctx.rope_cos.dim() == 4;
  auto cos = per_token ? ctx.rope_cos : ctx.rope_cos.narrow(0, 0, seq);
  auto sin = per_token ? ctx.rope_sin : ctx.rope_sin.narrow(0, 0, seq);
  q = ApplyRope(q, cos, sin);
  k = ApplyRope(k, cos, sin);
  if (kv_heads != heads) {  // grouped-query attention: each kv head serves heads/kv_heads
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  auto attn = (ctx.attention.defined() ? compat::MaskedAttention(q, k, v, ctx.attention)
                                       : compat::CausalAttention(q, k, v))
                  .transpose(1, 2)
                  .reshape({batch, seq, heads * dim});
  auto hidden = x + linear(kO, attn);
  auto m = RmsNorm(hidden, post_norm, eps);
  auto mlp = linear(kDown, F::silu(linear(kGate, m)) * linear(kUp, m));
  return hidden + mlp;
}

std::vector<std::pair<std::string, torch::Tensor>> MergeLora(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const LoraSpec& lora) {
  std::map<std::string, torch::Tensor> by_name(named.begin(), named.end());
  const double scale = lora.alpha / static_cast<double>(lora.rank);
  std::vector<std::pair<std::string, torch::Tensor>> merged;
  const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";
  for (const auto& [name, tensor] : named) {
    if (name.find(".lora_") != std::string::npos) continue;
    torch::Tensor out = tensor;
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    auto a = by_name.find(prefix + kA), b = by_name.find(prefix + kB);
    if (a != by_name.end() && b != by_name.end()) {
      auto delta = torch::matmul(b->second.to(torch::kFloat32), a->second.to(torch::kFloat32));
      out = (tensor.to(torch::kFloat32) + delta * scale).to(tensor.scalar_type());
    }
    merged.emplace_back(name, out);
  }
  return merged;
}

}  // namespace tidal::engine
