// worker/engine/model_config.cc
#include "worker/engine/model_config.h"

#include <algorithm>
#include <cmath>

#include "api/train_config.h"

namespace tidal::engine {

namespace {

const char* ArchitectureOf(const std::string& model_type) {
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "deepseek_v2") return "DeepseekV2ForCausalLM";
  if (model_type == "deepseek_v3") return "DeepseekV3ForCausalLM";
  return "LlamaForCausalLM";
}

bool IsDeepseek(const std::string& model_type) {
  return model_type == "deepseek_v2" || model_type == "deepseek_v3";
}

}  // namespace

int64_t ModelConfig::LayerParameterCount(int64_t layer) const {
  const int64_t h = hidden_size;
  int64_t attention = 0;
  if (uses_mla()) {
    const int64_t heads = num_attention_heads, latent = mla.kv_lora_rank + mla.qk_rope_head_dim;
    attention = mla.q_lora_rank == 0 ? h * heads * mla.qk_head_dim()
                                     : h * mla.q_lora_rank + mla.q_lora_rank +
                                           mla.q_lora_rank * heads * mla.qk_head_dim();
    attention += h * latent + mla.kv_lora_rank +
                 mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim) +
                 heads * mla.v_head_dim * h;
    if (o_bias) attention += mla.q_lora_rank + latent + h;
  } else {
    const int64_t q_dim = num_attention_heads * head_dim(),
                  kv_dim = num_key_value_heads * head_dim();
    attention = h * q_dim * 2 + h * kv_dim * 2;
    if (qkv_bias) attention += q_dim + 2 * kv_dim;
    if (o_bias) attention += h;
    if (qk_norm) attention += 2 * head_dim();
  }
  const bool v2_bias = mlp_bias && model_type != "deepseek_v3";
  auto mlp = [&](int64_t inter, bool bias) { return 3 * h * inter + (bias ? 2 * inter + h : 0); };
  int64_t total = attention + 2 * h;
  if (!IsMoeLayer(layer)) return total + mlp(intermediate_size, mlp_bias);
  const int64_t experts = moe.n_routed_experts;
  total += experts * h + (moe.sigmoid_scores() ? experts : 0);  // router (+ V3's bias)
  total += experts * 3 * h * moe.moe_intermediate_size;
  if (moe.n_shared_experts > 0)
    total += mlp(moe.moe_intermediate_size * moe.n_shared_experts, v2_bias);
  return total;
}

int64_t ModelConfig::BaseParameterCount() const {
  int64_t total = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) total += LayerParameterCount(l);
  const int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return total + embeddings + hidden_size;
}

int64_t ModelConfig::ActiveParameterCount() const {
  // The input embedding is a row lookup (no multiply); tied, it is also the head's matmul.
  int64_t idle = tie_word_embeddings ? 0 : vocab_size * hidden_size;
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (IsMoeLayer(l))
      idle += (moe.n_routed_experts - moe.num_experts_per_tok) * 3 * hidden_size *
              moe.moe_intermediate_size;
  return BaseParameterCount() - idle;
}

Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v <= 0)
      return InvalidArgument(std::string(name) + " must be > 0, got " + std::to_string(v));
    return OkStatus();
  };
  TIDAL_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  TIDAL_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  TIDAL_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  TIDAL_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  TIDAL_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  TIDAL_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  TIDAL_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (head_dim_override < 0) return InvalidArgument("head_dim must be > 0");
  if (head_dim_override == 0 && hidden_size % num_attention_heads != 0)
    return InvalidArgument("hidden_size (" + std::to_string(hidden_size) +
                           ") must be divisible by num_attention_heads (" +
                           std::to_string(num_attention_heads) + ")");
  if (RopeDim() % 2 != 0)
    return InvalidArgument(std::string(uses_mla() ? "qk_rope_head_dim" : "head_dim") +
                           " must be even for RoPE");
  if (num_attention_heads % num_key_value_heads != 0)
    return InvalidArgument("num_attention_heads (" + std::to_string(num_attention_heads) +
                           ") must be a multiple of num_key_value_heads (" +
                           std::to_string(num_key_value_heads) + ")");
  if (uses_mla()) {
    TIDAL_RETURN_IF_ERROR(positive("qk_nope_head_dim", mla.qk_nope_head_dim));
    TIDAL_RETURN_IF_ERROR(positive("qk_rope_head_dim", mla.qk_rope_head_dim));
    TIDAL_RETURN_IF_ERROR(positive("v_head_dim", mla.v_head_dim));
    if (mla.q_lora_rank < 0) return InvalidArgument("q_lora_rank must be > 0 or null");
    if (num_key_value_heads != num_attention_heads)
      return InvalidArgument("num_key_value_heads (" + std::to_string(num_key_value_heads) +
                             ") must equal num_attention_heads (" +
                             std::to_string(num_attention_heads) +
                             ") under multi-head latent attention");
  }
  if (moe.n_routed_experts < 0) return InvalidArgument("n_routed_experts must be >= 0");
  if (moe.n_routed_experts > 0) {
    TIDAL_RETURN_IF_ERROR(positive("num_experts_per_tok", moe.num_experts_per_tok));
    TIDAL_RETURN_IF_ERROR(positive("moe_intermediate_size", moe.moe_intermediate_size));
    if (moe.n_shared_experts < 0) return InvalidArgument("n_shared_experts must be >= 0");
    if (moe.first_k_dense_replace < 0) return InvalidArgument("first_k_dense_replace must be >= 0");
    if (moe.num_experts_per_tok > moe.n_routed_experts)
      return InvalidArgument("num_experts_per_tok (" + std::to_string(moe.num_experts_per_tok) +
                             ") exceeds n_routed_experts (" + std::to_string(moe.n_routed_experts) +
                             ")");
    if (moe.topk_method != "greedy") {
      TIDAL_RETURN_IF_ERROR(positive("n_group", moe.n_group));
      TIDAL_RETURN_IF_ERROR(positive("topk_group", moe.topk_group));
      if (moe.n_routed_experts % moe.n_group != 0)
        return InvalidArgument("n_routed_experts (" + std::to_string(moe.n_routed_experts) +
                               ") must be a multiple of n_group (" + std::to_string(moe.n_group) +
                               ")");
      if (moe.topk_group > moe.n_group)
        return InvalidArgument("topk_group (" + std::to_string(moe.topk_group) +
                               ") exceeds n_group (" + std::to_string(moe.n_group) + ")");
      const int64_t per_group = moe.n_routed_experts / moe.n_group;
      if (moe.topk_method == "noaux_tc" && per_group < 2)
        return InvalidArgument("noaux_tc ranks each group by its two best experts: n_group (" +
                               std::to_string(moe.n_group) +
                               ") must leave at least 2 experts per group");
      if (moe.num_experts_per_tok > moe.topk_group * per_group)
        return InvalidArgument("num_experts_per_tok (" + std::to_string(moe.num_experts_per_tok) +
                               ") exceeds the experts of topk_group groups (" +
                               std::to_string(moe.topk_group * per_group) + ")");
    }
  }
  if (!(rms_norm_eps > 0)) return InvalidArgument("rms_norm_eps must be > 0");
  if (!(rope_theta > 0)) return InvalidArgument("rope_theta must be > 0");
  if (rope.type != "default") {
    if (!(rope.factor > 0))
      return InvalidArgument("rope_parameters.factor must be > 0 for rope_type " + rope.type);
    if (rope.type == "llama3" && !(rope.high_freq_factor > rope.low_freq_factor))
      return InvalidArgument("rope_parameters: high_freq_factor must exceed low_freq_factor");
  }
  return OkStatus();
}

double ModelConfig::AttentionSoftmaxScale() const {
  const int64_t features = uses_mla() ? mla.qk_head_dim() : head_dim();
  double scale = 1.0 / std::sqrt(static_cast<double>(features));
  // DeepSeek's MLA (transformers' yarn_apply_mscale): any scaled RoPE with mscale_all_dim
  // multiplies the softmax scale by mscale(factor, mscale_all_dim)².
  if (uses_mla() && rope.type != "default" && rope.mscale_all_dim && *rope.mscale_all_dim != 0 &&
      rope.factor > 1) {
    const double m = 0.1 * *rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::RopeAttentionScaling() const {
  if (rope.type != "yarn") return 1.0;
  if (rope.attention_factor) return *rope.attention_factor;
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  if (rope.mscale && rope.mscale_all_dim && *rope.mscale != 0 && *rope.mscale_all_dim != 0)
    return mscale(rope.factor, *rope.mscale) / mscale(rope.factor, *rope.mscale_all_dim);
  return mscale(rope.factor, 1.0);
}

nlohmann::json ModelConfig::ToHfJson() const {
  nlohmann::json rope_parameters = {{"rope_type", rope.type}, {"rope_theta", rope_theta}};
  if (rope.type != "default") rope_parameters["factor"] = rope.factor;
  if (rope.type == "llama3" || rope.type == "yarn")
    rope_parameters["original_max_position_embeddings"] =
        rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings
                                                  : max_position_embeddings;
  if (rope.type == "llama3") {
    rope_parameters["low_freq_factor"] = rope.low_freq_factor;
    rope_parameters["high_freq_factor"] = rope.high_freq_factor;
  }
  if (rope.type == "yarn") {
    rope_parameters["beta_fast"] = rope.beta_fast;
    rope_parameters["beta_slow"] = rope.beta_slow;
    rope_parameters["truncate"] = rope.truncate;
    if (rope.attention_factor) rope_parameters["attention_factor"] = *rope.attention_factor;
    if (rope.mscale) rope_parameters["mscale"] = *rope.mscale;
    if (rope.mscale_all_dim) rope_parameters["mscale_all_dim"] = *rope.mscale_all_dim;
  }
  nlohmann::json j = {{"architectures", {ArchitectureOf(model_type)}},
                      {"model_type", model_type},
                      {"vocab_size", vocab_size},
                      {"hidden_size", hidden_size},
                      {"intermediate_size", intermediate_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"num_key_value_heads", num_key_value_heads},
                      {"head_dim", head_dim()},
                      {"max_position_embeddings", max_position_embeddings},
                      {"rms_norm_eps", rms_norm_eps},
                      {"rope_theta", rope_theta},
                      {"rope_parameters", rope_parameters},
                      {"initializer_range", initializer_range},
                      {"tie_word_embeddings", tie_word_embeddings},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "float32"}};
  if (model_type != "qwen2") j["attention_bias"] = o_bias;  // Qwen2's q/k/v bias is implied
  if (model_type == "llama" || model_type == "deepseek_v2") j["mlp_bias"] = mlp_bias;
  if (uses_mla()) {
    j["head_dim"] = mla.qk_rope_head_dim;  // what transformers' DeepSeek configs write
    j["q_lora_rank"] = mla.q_lora_rank > 0 ? nlohmann::json(mla.q_lora_rank) : nlohmann::json();
    j["kv_lora_rank"] = mla.kv_lora_rank;
    j["qk_nope_head_dim"] = mla.qk_nope_head_dim;
    j["qk_rope_head_dim"] = mla.qk_rope_head_dim;
    j["v_head_dim"] = mla.v_head_dim;
    if (model_type == "deepseek_v3") j["rope_interleave"] = mla.rope_interleave;
  }
  if (IsDeepseek(model_type)) {
    j["n_routed_experts"] = moe.n_routed_experts;
    j["num_experts_per_tok"] = moe.num_experts_per_tok;
    j["n_shared_experts"] = moe.n_shared_experts;
    j["moe_intermediate_size"] = moe.moe_intermediate_size;
    j["first_k_dense_replace"] = moe.first_k_dense_replace;
    j["topk_method"] = moe.topk_method;
    j["n_group"] = moe.n_group;
    j["topk_group"] = moe.topk_group;
    j["routed_scaling_factor"] = moe.routed_scaling_factor;
    j["norm_topk_prob"] = moe.norm_topk_prob;
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  return j;
}

std::vector<std::pair<int64_t, int64_t>> ModelConfig::ProjectionShapes(
    const std::string& module) const {
  const int64_t h = hidden_size;
  if (module == "gate_proj" || module == "up_proj" || module == "down_proj") {
    // With experts, PEFT (0.21, on transformers 5) takes these names to mean the routed
    // experts' fused gate_up_proj / down_proj parameters — not the dense layers' or the
    // shared experts' Linear modules: each expert's projection is the shape that counts.
    const int64_t inter = moe.n_routed_experts > 0 ? moe.moe_intermediate_size : intermediate_size;
    return {module == "down_proj" ? std::pair{h, inter} : std::pair{inter, h}};
  }
  if (uses_mla()) {
    const int64_t heads = num_attention_heads, q_out = heads * mla.qk_head_dim();
    if (module == "q_proj" && mla.q_lora_rank == 0) return {{q_out, h}};
    if (module == "q_a_proj" && mla.q_lora_rank > 0) return {{mla.q_lora_rank, h}};
    if (module == "q_b_proj" && mla.q_lora_rank > 0) return {{q_out, mla.q_lora_rank}};
    if (module == "kv_a_proj_with_mqa") return {{mla.kv_lora_rank + mla.qk_rope_head_dim, h}};
    if (module == "kv_b_proj")
      return {{heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank}};
    if (module == "o_proj") return {{h, heads * mla.v_head_dim}};
    return {};
  }
  const int64_t q = num_attention_heads * head_dim(), kv = num_key_value_heads * head_dim();
  if (module == "q_proj") return {{q, h}};
  if (module == "o_proj") return {{h, q}};
  if (module == "k_proj" || module == "v_proj") return {{kv, h}};
  return {};
}

std::vector<std::string> ModelConfig::LoraTargets() const {
  std::vector<std::string> out;
  for (const char* m : {"q_proj", "q_a_proj", "q_b_proj", "k_proj", "v_proj", "kv_a_proj_with_mqa",
                        "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    if (!ProjectionShapes(m).empty()) out.push_back(m);
  return out;
}

namespace {

// rope_parameters (transformers 5) or rope_scaling (earlier; "type" for "rope_type"), with
// the top-level rope_theta. Every key changes the frequencies: an unknown one is refused.
Status ParseRope(const nlohmann::json& json, ModelConfig& c) {
  const bool has_parameters =
      json.contains("rope_parameters") && !json["rope_parameters"].is_null();
  const bool has_scaling = json.contains("rope_scaling") && !json["rope_scaling"].is_null();
  if (!has_parameters && !has_scaling) return OkStatus();
  const char* field = has_parameters ? "rope_parameters" : "rope_scaling";
  const nlohmann::json& rope = json[field];
  const std::string where = std::string("config.json: ") + field;
  if (!rope.is_object()) return InvalidArgument(where + " must be an object");
  auto number = [&](const std::string& key, double& out) -> Status {
    const auto& v = rope[key];
    if (v.is_null()) return OkStatus();
    if (!v.is_number()) return InvalidArgument(where + "." + key + " must be a number");
    out = v.get<double>();
    return OkStatus();
  };
  for (const char* key : {"rope_type", "type"}) {
    if (!rope.contains(key) || rope[key].is_null()) continue;
    if (!rope[key].is_string()) return InvalidArgument(where + "." + key + " must be a string");
    c.rope.type = rope[key].get<std::string>();
  }
  static const std::vector<std::string> kTypes = {"default", "linear", "llama3", "yarn"};
  if (std::find(kTypes.begin(), kTypes.end(), c.rope.type) == kTypes.end())
    return InvalidArgument(where + ".rope_type \"" + c.rope.type +
                           "\" is not supported (supported: default, linear, llama3, yarn)");
  for (const auto& [key, value] : rope.items()) {
    if (key == "rope_type" || key == "type") continue;
    double v = 0;
    if (key == "rope_theta") {
      TIDAL_RETURN_IF_ERROR(number(key, v));
      if (value.is_null()) continue;
      if (!(v > 0)) return InvalidArgument(where + ".rope_theta must be > 0");
      if (json.contains("rope_theta") && json["rope_theta"].is_number() &&
          json["rope_theta"].get<double>() != v)
        return InvalidArgument("config.json: rope_theta and " + std::string(field) +
                               ".rope_theta differ");
      c.rope_theta = v;
    } else if (key == "factor" && c.rope.type != "default") {
      TIDAL_RETURN_IF_ERROR(number(key, c.rope.factor));
    } else if (key == "original_max_position_embeddings" &&
               (c.rope.type == "llama3" || c.rope.type == "yarn")) {
      if (!value.is_number_integer())
        return InvalidArgument(where + ".original_max_position_embeddings must be an integer");
      c.rope.original_max_position_embeddings = value.get<int64_t>();
    } else if (key == "low_freq_factor" && c.rope.type == "llama3") {
      TIDAL_RETURN_IF_ERROR(number(key, c.rope.low_freq_factor));
    } else if (key == "high_freq_factor" && c.rope.type == "llama3") {
      TIDAL_RETURN_IF_ERROR(number(key, c.rope.high_freq_factor));
    } else if (key == "beta_fast" && c.rope.type == "yarn") {
      TIDAL_RETURN_IF_ERROR(number(key, c.rope.beta_fast));
    } else if (key == "beta_slow" && c.rope.type == "yarn") {
      TIDAL_RETURN_IF_ERROR(number(key, c.rope.beta_slow));
    } else if ((key == "attention_factor" || key == "mscale" || key == "mscale_all_dim") &&
               c.rope.type == "yarn") {
      if (value.is_null()) continue;
      TIDAL_RETURN_IF_ERROR(number(key, v));
      (key == "attention_factor" ? c.rope.attention_factor
       : key == "mscale"         ? c.rope.mscale
                                 : c.rope.mscale_all_dim) = v;
    } else if (key == "truncate" && c.rope.type == "yarn") {
      if (!value.is_boolean()) return InvalidArgument(where + ".truncate must be true or false");
      c.rope.truncate = value.get<bool>();
    } else if (key == "partial_rotary_factor") {
      TIDAL_RETURN_IF_ERROR(number(key, v));
      if (v != 1.0)
        return InvalidArgument(where + ".partial_rotary_factor " + value.dump() +
                               " is not supported (only 1: RoPE on the whole head)");
    } else {
      return InvalidArgument(where + "." + key + " is not supported for rope_type \"" +
                             c.rope.type + "\"");
    }
  }
  if (c.rope.type == "yarn" && (!rope.contains("factor") || rope["factor"].is_null()) &&
      c.rope.original_max_position_embeddings > 0)
    c.rope.factor = static_cast<double>(c.max_position_embeddings) /
                    static_cast<double>(c.rope.original_max_position_embeddings);
  if ((c.rope.type == "linear" || c.rope.type == "llama3") && !rope.contains("factor"))
    return InvalidArgument(where + ".factor is required for rope_type \"" + c.rope.type + "\"");
  return OkStatus();
}

// quantization_config: only DeepSeek-V3's block-scaled FP8 (dequantized on load; training runs
// in the spec's precision), every key checked.
Status ParseQuantization(const nlohmann::json& json, ModelConfig& c) {
  if (!json.contains("quantization_config") || json["quantization_config"].is_null())
    return OkStatus();
  const nlohmann::json& q = json["quantization_config"];
  const std::string where = "config.json: quantization_config";
  if (!q.is_object()) return InvalidArgument(where + " must be an object");
  if (q.value("quant_method", "") != "fp8")
    return InvalidArgument(where + ".quant_method " +
                           q.value("quant_method", nlohmann::json()).dump() +
                           " is not supported (only \"fp8\": block-scaled FP8 weights, "
                           "dequantized on load)");
  c.fp8_block_rows = c.fp8_block_cols = 128;
  for (const auto& [key, value] : q.items()) {
    if (key == "quant_method" || key == "modules_to_not_convert") continue;
    if (key == "fmt" && value == "e4m3") continue;
    if (key == "activation_scheme" && value == "dynamic") continue;  // inference-only
    if (key == "weight_block_size" && value.is_array() && value.size() == 2 &&
        value[0].is_number_integer() && value[1].is_number_integer() &&
        value[0].get<int64_t>() > 0 && value[1].get<int64_t>() > 0) {
      c.fp8_block_rows = value[0].get<int64_t>();
      c.fp8_block_cols = value[1].get<int64_t>();
      continue;
    }
    return InvalidArgument(where + "." + key + " " + value.dump() + " is not supported");
  }
  return OkStatus();
}

// DeepSeek-V2/V3: MLA and MoE keys, with transformers' defaults where config.json leaves one
// out. transformers' V2 router always scores with softmax (greedy or group-limited top-k);
// its V3 router always uses sigmoid scores, the correction bias and group-limited choice
// (noaux_tc). DeepSeek's own configs name these (scoring_func, topk_method): a value the
// transformers model would not compute is refused.
Status ParseDeepseek(const nlohmann::json& json, ModelConfig& c) {
  const bool v3 = c.model_type == "deepseek_v3";
  auto where = [](const std::string& key) { return "config.json: " + key; };
  auto read_int = [&](const char* key, int64_t& out) -> Status {
    if (!json.contains(key) || json[key].is_null()) return OkStatus();
    if (!json[key].is_number_integer()) return InvalidArgument(where(key) + " must be an integer");
    out = json[key].get<int64_t>();
    return OkStatus();
  };
  MlaConfig& mla = c.mla;
  MoeConfig& moe = c.moe;
  // transformers' DeepseekV2Config / DeepseekV3Config defaults.
  mla = {1536, 512, 128, 64, 128, true};
  moe.n_routed_experts = v3 ? 256 : 64;
  moe.n_shared_experts = v3 ? 1 : 2;
  moe.moe_intermediate_size = v3 ? 2048 : 1407;
  moe.num_experts_per_tok = v3 ? 8 : 0;
  moe.first_k_dense_replace = v3 ? 3 : 0;
  moe.topk_method = v3 ? "noaux_tc" : "greedy";
  moe.n_group = v3 ? 8 : 0, moe.topk_group = v3 ? 4 : 0;
  moe.routed_scaling_factor = v3 ? 2.5 : 1.0;
  moe.norm_topk_prob = v3;
  if (json.contains("q_lora_rank") && json["q_lora_rank"].is_null()) mla.q_lora_rank = 0;
  TIDAL_RETURN_IF_ERROR(read_int("q_lora_rank", mla.q_lora_rank));
  if (json.contains("q_lora_rank") && !json["q_lora_rank"].is_null() && mla.q_lora_rank <= 0)
    return InvalidArgument(where("q_lora_rank") + " must be > 0 or null");
  TIDAL_RETURN_IF_ERROR(read_int("kv_lora_rank", mla.kv_lora_rank));
  if (mla.kv_lora_rank <= 0) return InvalidArgument(where("kv_lora_rank") + " must be > 0");
  TIDAL_RETURN_IF_ERROR(read_int("qk_nope_head_dim", mla.qk_nope_head_dim));
  TIDAL_RETURN_IF_ERROR(read_int("qk_rope_head_dim", mla.qk_rope_head_dim));
  TIDAL_RETURN_IF_ERROR(read_int("v_head_dim", mla.v_head_dim));
  if (v3 && json.contains("rope_interleave") && !json["rope_interleave"].is_null()) {
    if (!json["rope_interleave"].is_boolean())
      return InvalidArgument(where("rope_interleave") + " must be true or false");
    mla.rope_interleave = json["rope_interleave"].get<bool>();
  }
  TIDAL_RETURN_IF_ERROR(read_int("n_routed_experts", moe.n_routed_experts));
  TIDAL_RETURN_IF_ERROR(read_int("num_experts_per_tok", moe.num_experts_per_tok));
  TIDAL_RETURN_IF_ERROR(read_int("n_shared_experts", moe.n_shared_experts));
  TIDAL_RETURN_IF_ERROR(read_int("moe_intermediate_size", moe.moe_intermediate_size));
  TIDAL_RETURN_IF_ERROR(read_int("first_k_dense_replace", moe.first_k_dense_replace));
  TIDAL_RETURN_IF_ERROR(read_int("n_group", moe.n_group));
  TIDAL_RETURN_IF_ERROR(read_int("topk_group", moe.topk_group));
  if (json.contains("routed_scaling_factor") && !json["routed_scaling_factor"].is_null()) {
    if (!json["routed_scaling_factor"].is_number())
      return InvalidArgument(where("routed_scaling_factor") + " must be a number");
    moe.routed_scaling_factor = json["routed_scaling_factor"].get<double>();
  }
  if (json.contains("norm_topk_prob") && !json["norm_topk_prob"].is_null()) {
    if (!json["norm_topk_prob"].is_boolean())
      return InvalidArgument(where("norm_topk_prob") + " must be true or false");
    moe.norm_topk_prob = json["norm_topk_prob"].get<bool>();
  }
  auto string_key = [&](const char* key) -> std::optional<std::string> {
    if (!json.contains(key) || json[key].is_null()) return std::nullopt;
    return json[key].is_string() ? json[key].get<std::string>() : json[key].dump();
  };
  if (auto method = string_key("topk_method")) {
    const bool known =
        v3 ? *method == "noaux_tc" : (*method == "greedy" || *method == "group_limited_greedy");
    if (!known)
      return InvalidArgument(
          where("topk_method") + " \"" + *method + "\" is not supported for " + c.model_type +
          " (supported: " + (v3 ? "noaux_tc" : "greedy, group_limited_greedy") + ")");
    moe.topk_method = *method;
  }
  if (auto scoring = string_key("scoring_func");
      scoring && *scoring != (v3 ? "sigmoid" : "softmax"))
    return InvalidArgument(where("scoring_func") + " \"" + *scoring + "\" is not supported for " +
                           c.model_type + " (supported: " + (v3 ? "sigmoid" : "softmax") + ")");
  if (!v3 && moe.norm_topk_prob)
    return InvalidArgument(
        where("norm_topk_prob") +
        " true is not supported for deepseek_v2 (transformers' DeepseekV2 ignores it while "
        "DeepSeek's own code renormalises the top-k weights: the two disagree)");
  if (json.contains("moe_layer_freq") && !json["moe_layer_freq"].is_null() &&
      json["moe_layer_freq"] != 1)
    return InvalidArgument(where("moe_layer_freq") + " " + json["moe_layer_freq"].dump() +
                           " is not supported (only 1: every layer from first_k_dense_replace "
                           "on is a mixture of experts)");
  if (moe.topk_method == "greedy") moe.n_group = moe.topk_group = 1;
  // Read and not acted on, as transformers does not act on them: said in the log.
  if (json.contains("aux_loss_alpha") && json["aux_loss_alpha"].is_number() &&
      json["aux_loss_alpha"].get<double>() != 0)
    c.notes.push_back("aux_loss_alpha " + json["aux_loss_alpha"].dump() +
                      ": no auxiliary load-balance loss is added (as transformers; the router "
                      "is frozen under LoRA)");
  if (json.contains("num_nextn_predict_layers") && json["num_nextn_predict_layers"].is_number() &&
      json["num_nextn_predict_layers"].get<double>() != 0)
    c.notes.push_back("num_nextn_predict_layers " + json["num_nextn_predict_layers"].dump() +
                      ": the multi-token-prediction layers are not loaded (as transformers)");
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ModelConfigFromHfJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgument("config.json must be a JSON object");
  ModelConfig c;
  // The architecture: model_type, else architectures[0].
  std::string architecture;
  if (json.contains("architectures") && json["architectures"].is_array() &&
      !json["architectures"].empty() && json["architectures"][0].is_string())
    architecture = json["architectures"][0].get<std::string>();
  if (json.contains("model_type") && json["model_type"].is_string()) {
    c.model_type = json["model_type"].get<std::string>();
  } else if (!architecture.empty()) {
    c.model_type = architecture == "Qwen2ForCausalLM"        ? "qwen2"
                   : architecture == "Qwen3ForCausalLM"      ? "qwen3"
                   : architecture == "LlamaForCausalLM"      ? "llama"
                   : architecture == "DeepseekV2ForCausalLM" ? "deepseek_v2"
                   : architecture == "DeepseekV3ForCausalLM" ? "deepseek_v3"
                                                             : architecture;
  }
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      !IsDeepseek(c.model_type))
    return InvalidArgument("config.json: model_type \"" + c.model_type +
                           "\" is not supported (supported: llama, qwen2, qwen3, deepseek_v2, "
                           "deepseek_v3)");
  auto read_int = [&](const char* key, int64_t& out, bool required) -> Status {
    if (!json.contains(key) || json[key].is_null()) {
      return required ? InvalidArgument(std::string("config.json: missing required key ") + key)
                      : OkStatus();
    }
    if (!json[key].is_number_integer())
      return InvalidArgument(std::string("config.json: ") + key + " must be an integer");
    out = json[key].get<int64_t>();
    return OkStatus();
  };
  auto read_double = [&](const char* key, double& out) -> Status {
    if (!json.contains(key) || json[key].is_null()) return OkStatus();
    if (!json[key].is_number())
      return InvalidArgument(std::string("config.json: ") + key + " must be a number");
    out = json[key].get<double>();
    return OkStatus();
  };
  auto read_bool = [&](const char* key, bool& out) -> Status {
    if (!json.contains(key) || json[key].is_null()) return OkStatus();
    if (!json[key].is_boolean())
      return InvalidArgument(std::string("config.json: ") + key + " must be true or false");
    out = json[key].get<bool>();
    return OkStatus();
  };
  TIDAL_RETURN_IF_ERROR(read_int("vocab_size", c.vocab_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("hidden_size", c.hidden_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("intermediate_size", c.intermediate_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("num_hidden_layers", c.num_hidden_layers, true));
  TIDAL_RETURN_IF_ERROR(read_int("num_attention_heads", c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;  // HF default: multi-head attention
  TIDAL_RETURN_IF_ERROR(read_int("num_key_value_heads", c.num_key_value_heads, false));
  TIDAL_RETURN_IF_ERROR(read_int("max_position_embeddings", c.max_position_embeddings, false));
  TIDAL_RETURN_IF_ERROR(read_int("head_dim", c.head_dim_override, false));
  TIDAL_RETURN_IF_ERROR(read_double("rms_norm_eps", c.rms_norm_eps));
  TIDAL_RETURN_IF_ERROR(read_double("rope_theta", c.rope_theta));
  TIDAL_RETURN_IF_ERROR(read_double("initializer_range", c.initializer_range));
  TIDAL_RETURN_IF_ERROR(read_bool("tie_word_embeddings", c.tie_word_embeddings));
  if (json.contains("bos_token_id") && json["bos_token_id"].is_number_integer())
    c.bos_token_id = json["bos_token_id"].get<int64_t>();
  if (json.contains("eos_token_id")) {
    const auto& eos = json["eos_token_id"];
    if (eos.is_number_integer()) c.eos_token_ids.push_back(eos.get<int64_t>());
    if (eos.is_array())
      for (const auto& id : eos)
        if (id.is_number_integer()) c.eos_token_ids.push_back(id.get<int64_t>());
  }
  TIDAL_RETURN_IF_ERROR(ParseRope(json, c));
  TIDAL_RETURN_IF_ERROR(ParseQuantization(json, c));
  if (IsDeepseek(c.model_type)) TIDAL_RETURN_IF_ERROR(ParseDeepseek(json, c));
  // Biases and norms, per family as transformers builds them.
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  } else {
    bool attention_bias = false;
    TIDAL_RETURN_IF_ERROR(read_bool("attention_bias", attention_bias));
    // Under MLA attention_bias puts a bias on q_a_proj, kv_a_proj_with_mqa and o_proj.
    c.o_bias = attention_bias;
    c.qkv_bias = attention_bias && !c.uses_mla();
  }
  if (c.model_type == "llama" || c.model_type == "deepseek_v2")
    TIDAL_RETURN_IF_ERROR(read_bool("mlp_bias", c.mlp_bias));
  c.qk_norm = c.model_type == "qwen3";
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    bool sliding = false;
    TIDAL_RETURN_IF_ERROR(read_bool("use_sliding_window", sliding));
    if (sliding)
      return InvalidArgument(
          "config.json: use_sliding_window=true is not supported (sliding-"
          "window attention layers)");
    if (json.contains("layer_types") && json["layer_types"].is_array())
      for (const auto& t : json["layer_types"])
        if (t != "full_attention")
          return InvalidArgument("config.json: layer_types " + t.dump() +
                                 " is not supported (only \"full_attention\")");
  }
  double dropout = 0;
  TIDAL_RETURN_IF_ERROR(read_double("attention_dropout", dropout));
  if (dropout != 0)
    return InvalidArgument("config.json: attention_dropout " + json["attention_dropout"].dump() +
                           " is not supported (only 0)");
  if (json.contains("hidden_act") && json["hidden_act"] != "silu")
    return InvalidArgument("config.json: hidden_act " + json["hidden_act"].dump() +
                           " is not supported (only \"silu\": SwiGLU)");
  TIDAL_RETURN_IF_ERROR(c.Validate().WithContext("config.json"));
  return c;
}

StatusOr<ModelConfig> PresetModelConfig(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    // ~1.7 M parameters; vocab 512 covers the byte tokenizer's 256 bytes + specials.
    c.vocab_size = 512, c.hidden_size = 192, c.intermediate_size = 512, c.num_hidden_layers = 4;
    c.num_attention_heads = 6, c.num_key_value_heads = 2, c.max_position_embeddings = 1024;
    c.tie_word_embeddings = true, c.rms_norm_eps = 1e-6;
    // Fan-in scale (1/√hidden) rather than HF's 0.02, which is tuned for hidden ≈ 4096: with
    // a frozen tied embedding at 0.02 the logits of a 192-wide model span only about ±4, too
    // little for a LoRA fine-tune of a random base to express a peaked distribution.
    c.initializer_range = 0.072;
  } else if (name == "small") {
    // ~100 M parameters, LLaMA layout with grouped-query attention.
    c.vocab_size = 32000, c.hidden_size = 768, c.intermediate_size = 2048;
    c.num_hidden_layers = 12, c.num_attention_heads = 12, c.num_key_value_heads = 4;
    c.max_position_embeddings = 2048, c.tie_word_embeddings = true, c.rms_norm_eps = 1e-6;
  } else if (name == "1b") {
    // TinyLlama-1.1B shape.
    c.vocab_size = 32000, c.hidden_size = 2048, c.intermediate_size = 5632;
    c.num_hidden_layers = 22, c.num_attention_heads = 32, c.num_key_value_heads = 4;
    c.max_position_embeddings = 2048, c.rms_norm_eps = 1e-5;
  } else if (name == "7b") {
    // deepseek-ai/deepseek-llm-7b-base shape.
    c.vocab_size = 102400, c.hidden_size = 4096, c.intermediate_size = 11008;
    c.num_hidden_layers = 30, c.num_attention_heads = 32, c.num_key_value_heads = 32;
    c.max_position_embeddings = 4096, c.rms_norm_eps = 1e-6;
  } else if (name == "r1-distill-qwen-7b") {
    // deepseek-ai/DeepSeek-R1-Distill-Qwen-7B (Qwen2.5-Math-7B): 7.62 B, q/k/v bias.
    c.model_type = "qwen2", c.qkv_bias = true;
    c.vocab_size = 152064, c.hidden_size = 3584, c.intermediate_size = 18944;
    c.num_hidden_layers = 28, c.num_attention_heads = 28, c.num_key_value_heads = 4;
    c.max_position_embeddings = 131072, c.rope_theta = 10000, c.rms_norm_eps = 1e-6;
    c.bos_token_id = 151643, c.eos_token_ids = {151643};
  } else if (name == "r1-distill-llama-8b") {
    // deepseek-ai/DeepSeek-R1-Distill-Llama-8B (Llama-3.1-8B): 8.03 B, llama3 RoPE.
    c.vocab_size = 128256, c.hidden_size = 4096, c.intermediate_size = 14336;
    c.num_hidden_layers = 32, c.num_attention_heads = 32, c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072, c.rope_theta = 500000, c.rms_norm_eps = 1e-5;
    c.rope.type = "llama3", c.rope.factor = 8, c.rope.low_freq_factor = 1;
    c.rope.high_freq_factor = 4, c.rope.original_max_position_embeddings = 8192;
    c.bos_token_id = 128000, c.eos_token_ids = {128001};
  } else if (name == "r1-0528-qwen3-8b") {
    // deepseek-ai/DeepSeek-R1-0528-Qwen3-8B (Qwen3-8B): 8.19 B, q/k norms, yarn RoPE.
    c.model_type = "qwen3", c.qk_norm = true, c.head_dim_override = 128;
    c.vocab_size = 151936, c.hidden_size = 4096, c.intermediate_size = 12288;
    c.num_hidden_layers = 36, c.num_attention_heads = 32, c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072, c.rope_theta = 1000000, c.rms_norm_eps = 1e-6;
    c.rope.type = "yarn", c.rope.factor = 4, c.rope.original_max_position_embeddings = 32768;
  } else if (name == "deepseek-v2-lite") {
    // deepseek-ai/DeepSeek-V2-Lite: 15.7 B total, 2.4 B active; MLA without a q latent, 64
    // routed experts (6 per token) + 2 shared from layer 1 on, yarn RoPE with mscale.
    c.model_type = "deepseek_v2";
    c.vocab_size = 102400, c.hidden_size = 2048, c.intermediate_size = 10944;
    c.num_hidden_layers = 27, c.num_attention_heads = 16, c.num_key_value_heads = 16;
    c.max_position_embeddings = 163840, c.rope_theta = 10000, c.rms_norm_eps = 1e-6;
    c.rope.type = "yarn", c.rope.factor = 40, c.rope.original_max_position_embeddings = 4096;
    c.rope.mscale = 0.707, c.rope.mscale_all_dim = 0.707;
    c.mla = {0, 512, 128, 64, 128, true};
    c.moe.n_routed_experts = 64, c.moe.num_experts_per_tok = 6, c.moe.n_shared_experts = 2;
    c.moe.moe_intermediate_size = 1408, c.moe.first_k_dense_replace = 1;
    c.bos_token_id = 100000, c.eos_token_ids = {100001};
  } else {
    return UnknownPreset(name);
  }
  return c;
}

}  // namespace tidal::engine
