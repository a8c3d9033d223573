// worker/engine/model_config.cc
#include "worker/engine/model_config.h"

namespace tidal::engine {

int64_t ModelConfig::BaseParameterCount() const {
  const int64_t kv_dim = num_key_value_heads * head_dim();
  const int64_t attention = hidden_size * hidden_size * 2 + hidden_size * kv_dim * 2;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t per_layer = attention + mlp + 2 * hidden_size;
  const int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return per_layer * num_hidden_layers + embeddings + hidden_size;
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
  if (hidden_size % num_attention_heads != 0)
    return InvalidArgument("hidden_size (" + std::to_string(hidden_size) +
                           ") must be divisible by num_attention_heads (" +
                           std::to_string(num_attention_heads) + ")");
  if (head_dim() % 2 != 0)
    return InvalidArgument("head_dim (hidden_size / num_attention_heads) must be even for RoPE");
  if (num_attention_heads % num_key_value_heads != 0)
    return InvalidArgument("num_attention_heads (" + std::to_string(num_attention_heads) +
                           ") must be a multiple of num_key_value_heads (" +
                           std::to_string(num_key_value_heads) + ")");
  if (!(rms_norm_eps > 0)) return InvalidArgument("rms_norm_eps must be > 0");
  if (!(rope_theta > 0)) return InvalidArgument("rope_theta must be > 0");
  return OkStatus();
}

nlohmann::json ModelConfig::ToHfJson() const {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", vocab_size},
                      {"hidden_size", hidden_size},
                      {"intermediate_size", intermediate_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"num_key_value_heads", num_key_value_heads},
                      {"max_position_embeddings", max_position_embeddings},
                      {"rms_norm_eps", rms_norm_eps},
                      {"rope_theta", rope_theta},
                      {"initializer_range", initializer_range},
                      {"tie_word_embeddings", tie_word_embeddings},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "float32"}};
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  return j;
}

std::optional<std::pair<int64_t, int64_t>> ModelConfig::ProjectionShape(
    const std::string& module) const {
  const int64_t h = hidden_size, kv = num_key_value_heads * head_dim(), inter = intermediate_size;
  if (module == "q_proj" || module == "o_proj") return std::pair{h, h};
  if (module == "k_proj" || module == "v_proj") return std::pair{kv, h};
  if (module == "gate_proj" || module == "up_proj") return std::pair{inter, h};
  if (module == "down_proj") return std::pair{h, inter};
  return std::nullopt;
}

StatusOr<ModelConfig> ModelConfigFromHfJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgument("config.json must be a JSON object");
  ModelConfig c;
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
  TIDAL_RETURN_IF_ERROR(read_int("vocab_size", c.vocab_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("hidden_size", c.hidden_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("intermediate_size", c.intermediate_size, true));
  TIDAL_RETURN_IF_ERROR(read_int("num_hidden_layers", c.num_hidden_layers, true));
  TIDAL_RETURN_IF_ERROR(read_int("num_attention_heads", c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;  // HF default: multi-head attention
  TIDAL_RETURN_IF_ERROR(read_int("num_key_value_heads", c.num_key_value_heads, false));
  TIDAL_RETURN_IF_ERROR(read_int("max_position_embeddings", c.max_position_embeddings, false));
  TIDAL_RETURN_IF_ERROR(read_double("rms_norm_eps", c.rms_norm_eps));
  TIDAL_RETURN_IF_ERROR(read_double("rope_theta", c.rope_theta));
  TIDAL_RETURN_IF_ERROR(read_double("initializer_range", c.initializer_range));
  if (json.contains("tie_word_embeddings") && json["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = json["tie_word_embeddings"].get<bool>();
  if (json.contains("bos_token_id") && json["bos_token_id"].is_number_integer())
    c.bos_token_id = json["bos_token_id"].get<int64_t>();
  if (json.contains("eos_token_id")) {
    const auto& eos = json["eos_token_id"];
    if (eos.is_number_integer()) c.eos_token_ids.push_back(eos.get<int64_t>());
    if (eos.is_array())
      for (const auto& id : eos)
        if (id.is_number_integer()) c.eos_token_ids.push_back(id.get<int64_t>());
  }
  if (json.contains("rope_scaling") && !json["rope_scaling"].is_null())
    return InvalidArgument("config.json: rope_scaling is not supported yet (got " +
                           json["rope_scaling"].dump() + ")");
  // transformers 5 writes RoPE as rope_parameters {rope_type, rope_theta} instead of a
  // top-level rope_theta; both forms must give the same model.
  if (json.contains("rope_parameters") && !json["rope_parameters"].is_null()) {
    const auto& rope = json["rope_parameters"];
    if (!rope.is_object()) return InvalidArgument("config.json: rope_parameters must be an object");
    if (rope.contains("rope_type") && rope["rope_type"] != "default")
      return InvalidArgument("config.json: rope_parameters.rope_type " + rope["rope_type"].dump() +
                             " is not supported yet (expected \"default\")");
    for (const auto& [key, value] : rope.items()) {
      if (key == "rope_type") continue;
      if (key != "rope_theta")
        return InvalidArgument("config.json: rope_parameters." + key + " is not supported");
      if (!value.is_number() || !(value.get<double>() > 0))
        return InvalidArgument("config.json: rope_parameters.rope_theta must be a number > 0");
      if (json.contains("rope_theta") && json["rope_theta"].is_number() &&
          json["rope_theta"].get<double>() != value.get<double>())
        return InvalidArgument("config.json: rope_theta and rope_parameters.rope_theta differ");
      c.rope_theta = value.get<double>();
    }
  }
  // head_dim other than hidden_size / num_attention_heads changes every projection's shape.
  if (json.contains("head_dim") && !json["head_dim"].is_null()) {
    if (!json["head_dim"].is_number_integer() || c.num_attention_heads <= 0 ||
        json["head_dim"].get<int64_t>() * c.num_attention_heads != c.hidden_size)
      return InvalidArgument("config.json: head_dim " + json["head_dim"].dump() +
                             " is not supported (expected hidden_size / num_attention_heads)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (json.contains(key) && json[key].is_boolean() && json[key].get<bool>())
      return InvalidArgument(std::string("config.json: ") + key + "=true is not supported");
  }
  if (json.contains("hidden_act") && json["hidden_act"] != "silu")
    return InvalidArgument("config.json: hidden_act must be \"silu\" (SwiGLU), got " +
                           json["hidden_act"].dump());
  TIDAL_RETURN_IF_ERROR(c.Validate().WithContext("config.json"));
  return c;
}

std::vector<std::string> PresetNames() { return {"tiny", "small", "1b", "7b"}; }

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
  } else {
    std::string known;
    for (const auto& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown model preset \"" + name + "\" (expected one of: " + known +
                           ")");
  }
  return c;
}

}  // namespace tidal::engine
