// worker/engine/model_config.h — the decoder architecture's hyper-parameters, read from a
// Hugging Face `config.json` (LlamaForCausalLM / DeepSeek-LLM layout) or a named preset.
// No LibTorch here: the config is plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::engine {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  // config.json's special token ids, when it names them (eos_token_id may be a list).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Every parameter of the base model (LoRA adapters excluded).
  int64_t BaseParameterCount() const;

  Status Validate() const;
  nlohmann::json ToHfJson() const;
  // (out, in) features of a decoder layer's projection (q_proj … down_proj); nullopt for
  // another name.
  std::optional<std::pair<int64_t, int64_t>> ProjectionShape(const std::string& module) const;
};

// Parses an HF config.json object; unknown keys are ignored as transformers does, but a key
// whose meaning would change the architecture in a way not implemented (rope_scaling,
// attention bias) is refused with its name.
StatusOr<ModelConfig> ModelConfigFromHfJson(const nlohmann::json& json);

// "tiny" (~1.7 M params, tests), "small" (~100 M), "1b" (TinyLlama-1.1B shape),
// "7b" (DeepSeek-LLM-7B shape).
StatusOr<ModelConfig> PresetModelConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace tidal::engine
