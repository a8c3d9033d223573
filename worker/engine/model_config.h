// worker/engine/model_config.h — the decoder architecture's hyper-parameters, read from a
// Hugging Face `config.json` — LlamaForCausalLM (LLaMA, DeepSeek-LLM, Llama-3.x and the
// R1-Distill-Llama models, with RoPE scaling), Qwen2ForCausalLM (the R1-Distill-Qwen models:
// q/k/v bias), Qwen3ForCausalLM (RMSNorm on each head's q and k), DeepseekV2ForCausalLM and
// DeepseekV3ForCausalLM (multi-head latent attention + mixture of experts) — or a named preset.
// No LibTorch here: the config is plain data. The names a spec may give as a preset are
// api/train_config.h's PresetNames(); each is defined here.
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

// DeepSeek-V2/V3 multi-head latent attention: q (optionally through a low-rank q_a/q_b pair),
// and k/v expanded per head from one shared latent of kv_lora_rank plus one shared RoPE key.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0 (config null): q_proj straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // RoPE over (x0, x1), (x2, x3)… pairs, as DeepSeek lays them out
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// DeepSeek-V2/V3 mixture of experts: a router picks num_experts_per_tok of n_routed_experts
// per token; shared experts see every token. Layers before first_k_dense_replace are dense.
struct MoeConfig {
  int64_t n_routed_experts = 0;  // 0: every layer is a dense MLP
  int64_t num_experts_per_tok = 0, n_shared_experts = 0, moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  // greedy | group_limited_greedy (V2, softmax scores) | noaux_tc (V3, sigmoid scores plus
  // e_score_correction_bias for the choice, groups ranked by their two best).
  std::string topk_method = "greedy";
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  bool sigmoid_scores() const { return topk_method == "noaux_tc"; }
};

struct ModelConfig {
  // config.json's model_type: llama | qwen2 | qwen3 | deepseek_v2 | deepseek_v3.
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
  MlaConfig mla;         // deepseek_v2 / deepseek_v3
  MoeConfig moe;
  // quantization_config {quant_method: fp8, weight_block_size: [rows, cols]} (DeepSeek-V3/R1):
  // FP8 weights with a weight_scale_inv per block, dequantized on load. 0: not quantized.
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  // Keys read and deliberately not acted on, as transformers does not (e.g. DeepSeek's
  // aux_loss_alpha): the engine logs each so that nothing is ignored silently.
  std::vector<std::string> notes;
  // config.json's special token ids, when it names them (eos_token_id may be a list).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  int64_t head_dim() const {
    return head_dim_override > 0 ? head_dim_override : hidden_size / num_attention_heads;
  }
  bool uses_mla() const { return mla.kv_lora_rank > 0; }
  bool IsMoeLayer(int64_t layer) const {
    return moe.n_routed_experts > 0 && layer >= moe.first_k_dense_replace;
  }
  // The features RoPE rotates: qk_rope_head_dim under MLA, else the whole head.
  int64_t RopeDim() const { return uses_mla() ? mla.qk_rope_head_dim : head_dim(); }
  // The multiplier transformers applies to cos and sin (yarn's attention factor; 1 otherwise).
  double RopeAttentionScaling() const;
  // The softmax scale of attention: 1/√(q·k features), times yarn's mscale² under MLA.
  double AttentionSoftmaxScale() const;
  // Every parameter of the base model (LoRA adapters excluded).
  int64_t BaseParameterCount() const;
  // The base parameters of decoder layer `layer` (dense or MoE).
  int64_t LayerParameterCount(int64_t layer) const;
  // The parameters one token's compute multiplies by (what FLOPs and MFU count): the base less
  // the routed experts it skips and the untied input embedding (a row lookup).
  int64_t ActiveParameterCount() const;

  Status Validate() const;
  nlohmann::json ToHfJson() const;
  // (out, in) features of the projections named `module` that LoRA can target (q_proj …
  // down_proj; q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj under MLA; in a model
  // with experts, gate/up/down_proj are each routed expert's, see the .cc); empty for a name
  // this model does not have.
  std::vector<std::pair<int64_t, int64_t>> ProjectionShapes(const std::string& module) const;
  // The projections LoRA can target in this model, in PEFT's names.
  std::vector<std::string> LoraTargets() const;
};

// Parses an HF config.json object. Keys that transformers' model of that type does not read
// are ignored, as transformers does; a value that would change the computation in a way not
// implemented (another model_type, rope_type, hidden_act, sliding-window layers, partial
// rotary, attention dropout) is refused naming the field and the value.
StatusOr<ModelConfig> ModelConfigFromHfJson(const nlohmann::json& json);

// "tiny" (~1.7 M params, tests), "small" (~100 M), "1b" (TinyLlama-1.1B shape),
// "7b" (DeepSeek-LLM-7B shape), and the real shapes for memory and throughput planning:
// "r1-distill-qwen-7b", "r1-distill-llama-8b", "r1-0528-qwen3-8b", "deepseek-v2-lite"
// (15.7 B total, 2.4 B active).
StatusOr<ModelConfig> PresetModelConfig(const std::string& name);

}  // namespace tidal::engine
