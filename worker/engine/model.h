// worker/engine/model.h — the decoders of LLaMA / DeepSeek-LLM / Llama-3 (RoPE scaling), Qwen2
// (q/k/v bias), Qwen3 (per-head q/k RMSNorm) and DeepSeek-V2/V3 (multi-head latent attention,
// mixture of experts with shared experts and group-limited routing): RMSNorm, RoPE, SwiGLU,
// grouped-query or latent attention, tied or untied embeddings, with LoRA adapters, written as
// plain functions over parameter tensors. The model knows nothing of sharding: it declares its
// parameters in blocks (embedding, one per decoder layer, head) and computes one block from tensors
// it is handed; worker/engine/zero.h decides where those tensors live (STYLE.md: parallelism is
// applied to a plain model).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "api/train_config.h"
#include "worker/engine/model_config.h"

namespace tidal::engine {

enum class BlockKind { kEmbedding, kDecoderLayer, kHead };

struct ParamSpec {
  std::string name;  // HF name, e.g. model.layers.3.self_attn.q_proj.lora_A.weight
  std::vector<int64_t> shape;
  bool trainable = false;
  int64_t numel() const;
};

struct BlockSpec {
  BlockKind kind;
  int64_t layer = -1;  // decoder layer index, -1 for embedding and head
  std::vector<ParamSpec> params;
};

// What the mixture-of-experts layers routed in the last forward: per MoE layer, the tokens each
// expert received ([n_routed_experts] int64) and, when asked, each token's chosen experts
// ([tokens, num_experts_per_tok] int64, ascending). A layer overwrites its entry, so the
// recompute of ZeRO-3's backward leaves the same record.
struct MoeRecord {
  bool keep_choices = false;
  std::map<int64_t, torch::Tensor> expert_tokens;
  std::map<int64_t, torch::Tensor> choices;
};

// Everything a block needs besides its parameters and input activations.
struct ForwardContext {
  torch::Tensor tokens;   // [batch, seq] int64, for the embedding block
  torch::Tensor targets;  // [batch, seq] int64, -100 = not in the loss; undefined → logits
  // [seq, head_dim] fp32 for positions 0..seq-1, or [batch, 1, seq, head_dim]: each token's
  // own position (packed rows restart positions at every document).
  torch::Tensor rope_cos, rope_sin;
  // [batch, 1, seq, seq] bool, true where a query may attend to a key (causal within each
  // packed document); undefined: plain causal attention.
  torch::Tensor attention;
  bool training = false;
  // LoRA dropout masks are drawn from generators seeded by (dropout_key, layer, module), so a
  // micro-batch gets the same masks whichever rank runs it and when ZeRO-3 recomputes it.
  uint64_t dropout_key = 0;
  // When set, each row's own key instead (one per row): its masks are those it has as a
  // micro-batch of its own, however rows are grouped (microBatchSize auto).
  std::vector<uint64_t> row_dropout_keys;
  // With targets: each row's summed token loss times its weight ([batch] fp32), summed;
  // undefined: the plain sum over every token.
  torch::Tensor row_loss_weights;
  MoeRecord* moe = nullptr;  // filled when set
};

class DecoderModel {
 public:
  DecoderModel(ModelConfig config, LoraSpec lora);

  const ModelConfig& config() const { return config_; }
  const LoraSpec& lora() const { return lora_; }
  const std::vector<BlockSpec>& blocks() const { return blocks_; }
  int64_t head_block() const { return static_cast<int64_t>(blocks_.size()) - 1; }
  // With tied embeddings the head reads the embedding block's table as lm_head.
  bool head_uses_embedding() const { return config_.tie_word_embeddings; }

  // Runs block `b`. `params` align with blocks()[b].params; `embedding` is the embedding
  // table, used by the head when embeddings are tied. Embedding: returns hidden states from
  // ctx.tokens. Decoder layer: hidden → hidden. Head: the summed token cross-entropy (fp32
  // scalar) when ctx.targets is defined, else logits [batch, seq, vocab].
  torch::Tensor ForwardBlock(int64_t b, const std::vector<torch::Tensor>& params,
                             const torch::Tensor& x, const ForwardContext& ctx,
                             const torch::Tensor& embedding = {}) const;

  // RoPE tables for positions [0, seq) as in HF LlamaRotaryEmbedding (non-interleaved halves).
  std::pair<torch::Tensor, torch::Tensor> RopeTables(int64_t seq, torch::Device device) const;

  // A deterministic initial value for a parameter: a pure function of (seed, name), so every
  // rank and every world size starts from the same model. Norms 1, LoRA B 0, LoRA A as PEFT
  // (kaiming-uniform, a=√5), everything else N(0, initializer_range).
  torch::Tensor InitialValue(const ParamSpec& spec, uint64_t seed) const;

 private:
  torch::Tensor DecoderLayer(int64_t layer, const std::vector<torch::Tensor>& p,
                             const torch::Tensor& x, const ForwardContext& ctx) const;
  // What each parameter of a decoder layer block is (layers differ: dense or MoE).
  struct ParamRole {
    enum Kind {
      kInputNorm,
      kPostNorm,
      kQNorm,
      kKNorm,
      kQANorm,
      kKVANorm,  // RMSNorm weights
      kRouter,
      kRouterBias,  // MoE gate, V3's correction
      kWeight,
      kBias,
      kLoraA,
      kLoraB  // of projection `module`
    } kind;
    size_t module = 0;  // a ModuleId (model.cc); also keys LoRA dropout masks
  };
  std::vector<std::vector<ParamRole>> layer_roles_;  // per decoder layer
  ModelConfig config_;
  LoraSpec lora_;
  double lora_scale_;
  std::vector<BlockSpec> blocks_;
};

// Folds every adapter into its base weight: W' = W + (alpha / r) · B · A; with
// `routed_experts` > 0, a routed expert's gate/up/down weight takes its expert's slice of the
// experts' fused adapters. `named` maps HF names to full tensors; returns the base weights
// (adapter entries removed), or InvalidArgument for an adapter whose shape does not fit.
// `adapted`, when set, receives the names of the weights an adapter changed.
StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> MergeLora(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const LoraSpec& lora,
    int64_t routed_experts = 0, std::vector<std::string>* adapted = nullptr);

// 64-bit mixing (splitmix64 finaliser) for deriving seeds from keys.
uint64_t MixSeed(uint64_t a, uint64_t b);
uint64_t HashName(const std::string& name);

}  // namespace tidal::engine
