// worker/engine/model_config.h — the decoder architecture's hyper-parameters, read from a
// Hugging Face `config.json` — LlamaForCausalLM (LLaMA, DeepSeek-LLM, Llama-3.x and the
// R1-Distill-Llama models, with RoPE scaling), Qwen2ForCausalLM (the R1-Distill-Qwen models:
// q/k/v bias) and Qwen3ForCausalLM (RMSNorm on each head's q and k) — or a named preset.
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

// RoPE as config.json's rope_parameters (transformers 5) or rope_scaling (earlier) says:
// the inverse frequencies of transformers' modeling_rope_utils for each rope_type.
struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | yarn
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // llama3, yarn (else max_position_embeddings)
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  std::optional<double> attention_factor, mscale, mscale_all_dim;
  bool truncate = true;
};

struct ModelConfig {
  // config.json's model_type: llama | qwen2 | qwen3 (architectures LlamaForCausalLM,
  // Qwen2ForCausalLM, Qwen3ForCausalLM).
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  // 0: hidden_size / num_attention_heads (Qwen3 and some Llama-3 sizes set it apart).
  int64_t head_dim_override = 0;
  // Biases: q/k/v (Qwen2 always; Llama and Qwen3 with attention_bias), o_proj (attention_bias),
  // gate/up/down (Llama's mlp_bias).
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim on q and k, before RoPE
  // config.json's special token ids, when it names them (eos_token_id may be a list).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  int64_t head_dim() const {
    return head_dim_override > 0 ? head_dim_override : hidden_size / num_attention_heads;
  }
  // The multiplier transformers applies to cos and sin (yarn's attention factor; 1 otherwise).
  double RopeAttentionScaling() const;
  // Every parameter of the base model (LoRA adapters excluded).
  int64_t BaseParameterCount() const;

  Status Validate() const;
  nlohmann::json ToHfJson() const;
  // (out, in) features of a decoder layer's projection (q_proj … down_proj); nullopt for
  // another name.
  std::optional<std::pair<int64_t, int64_t>> ProjectionShape(const std::string& module) const;
};

// Parses an HF config.json object. Keys that transformers' model of that type does not read
// are ignored, as transformers does; a value that would change the computation in a way not
// implemented (another model_type, rope_type, hidden_act, sliding-window layers, partial
// rotary, attention dropout) is refused naming the field and the value.
StatusOr<ModelConfig> ModelConfigFromHfJson(const nlohmann::json& json);

// "tiny" (~1.7 M params, tests), "small" (~100 M), "1b" (TinyLlama-1.1B shape),
// "7b" (DeepSeek-LLM-7B shape), and the shapes of the R1 distills for memory and throughput
// planning: "r1-distill-qwen-7b", "r1-distill-llama-8b", "r1-0528-qwen3-8b".
StatusOr<ModelConfig> PresetModelConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace tidal::engine
