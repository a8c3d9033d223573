// The engine against the libraries our users trust: transformers' LlamaForCausalLM (RoPE
// scaling llama3 / linear / yarn, biases, head_dim), Qwen2ForCausalLM, Qwen3ForCausalLM,
// DeepseekV2ForCausalLM and DeepseekV3ForCausalLM (latent attention, experts: every token's
// chosen experts must be transformers') with a PEFT LoRA adapter whose B is not zero
// (tests/hf/peft_case.py, the real packages from tools/venv). The engine loads the base model
// transformers saved and the adapter PEFT saved, and must give the same logits and loss (1e-5
// relative) and, after one backward on the same batch, the same gradient for every LoRA weight
// (1e-4 relative), at ZeRO stages 0 and 3 (where backward recomputes each block from gathered
// shards). The base is stored as transformers stores it: fp32, bf16, fp16, one file or shards with
// an index.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/test_paths.h"
#include "tests/unit/engine/test_util.h"
#include "worker/checkpoint/peft_export.h"
#include "worker/engine/comm.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/safetensors.h"

namespace tidal::engine {
namespace {

using namespace std::chrono_literals;

struct OracleCase {
  const char* name;
  const char* json;  // overrides of peft_case.py's defaults
};

// Largest absolute difference, relative to the largest magnitude of the expected values.
double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual - expected).abs().max().item<double>() / std::max(scale, 1e-30);
}

class HfOracleTest : public ::testing::TestWithParam<std::tuple<OracleCase, int>> {
 protected:
  void SetUp() override {
    const auto& [c, stage] = GetParam();
    auto made = tidal::testing::RunProcess(
        {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/hf/peft_case.py", dir_.path(),
         c.json},
        300s);
    ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
    auto expected = SafetensorsFile::Open(dir_.path() + "/expected.safetensors");
    ASSERT_TRUE(expected.ok()) << expected.status().message();
    expected_ = std::move(*expected);
    auto adapter = SafetensorsFile::Open(dir_.path() + "/adapter/adapter_model.safetensors");
    ASSERT_TRUE(adapter.ok()) << adapter.status().message();
    adapter_ = std::move(*adapter);
    std::ifstream config_file(dir_.path() + "/adapter/adapter_config.json");
    adapter_config_ = nlohmann::json::parse(config_file);
  }

  torch::Tensor Expected(const std::string& name) {
    auto t = expected_->Read(
        name, name == "tokens" || name == "targets" ? torch::kInt64 : torch::kFloat32);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : torch::Tensor();
  }

  testing::TempDir dir_;
  std::unique_ptr<SafetensorsFile> expected_, adapter_;
  nlohmann::json adapter_config_;
};

TEST_P(HfOracleTest, LogitsLossAndLoraGradientsEqualTransformersWithPeft) {
  const int stage = std::get<1>(GetParam());
  auto hf = HfCheckpoint::Open(dir_.path() + "/base");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  // The adapter's shape as PEFT wrote it in adapter_config.json.
  LoraSpec lora;
  lora.rank = adapter_config_.at("r").get<int64_t>();
  lora.alpha = adapter_config_.at("lora_alpha").get<double>();
  lora.dropout = 0;
  if (adapter_config_.at("target_modules").is_array())
    lora.target_modules = adapter_config_.at("target_modules").get<std::vector<std::string>>();
  // A MoE model's expert targets, which PEFT turned into its fused target_parameters.
  const nlohmann::json& parameters = adapter_config_.at("target_parameters");
  for (const auto& p : parameters.is_array() ? parameters : nlohmann::json::array()) {
    if (p == "gate_up_proj")
      lora.target_modules.insert(lora.target_modules.end(), {"gate_proj", "up_proj"});
    if (p == "down_proj") lora.target_modules.push_back("down_proj");
  }
  DecoderModel model((*hf)->config(), lora);
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {stage, torch::kCPU, torch::kFloat32});

  // Base weights from transformers' directory; LoRA weights from PEFT's file, by the key rule
  // the engine's own export uses. Every adapter tensor must be used.
  ParameterReader base = (*hf)->Reader(model, /*adapter_seed=*/0);
  std::set<std::string> used;
  ASSERT_TRUE(params
                  .Load([&](const ParamSpec& spec, int64_t first,
                            int64_t count) -> StatusOr<torch::Tensor> {
                    if (!spec.trainable) return base(spec, first, count);
                    const std::string peft =
                        checkpoint::PeftTensorName(spec.name, lora.target_modules);
                    used.insert(peft);
                    return adapter_->ReadFlatRange(peft, first, count, torch::kFloat32);
                  })
                  .ok());
  EXPECT_EQ(used.size(), adapter_->entries().size());

  const torch::Tensor tokens = Expected("tokens"), targets = Expected("targets");
  auto logits = testing::Logits(params, model, tokens);
  EXPECT_LE(RelativeError(logits, Expected("logits")), 1e-5);

  ForwardContext ctx;
  ctx.tokens = tokens;
  ctx.targets = targets;
  std::tie(ctx.rope_cos, ctx.rope_sin) = model.RopeTables(tokens.size(1), torch::kCPU);
  ctx.training = true;
  MoeRecord routed;
  routed.keep_choices = true;
  ctx.moe = &routed;
  auto loss_sum = params.Forward(ctx);
  ASSERT_TRUE(loss_sum.ok()) << loss_sum.status().message();
  // Mixture of experts: each token's experts are the ones transformers' router chose.
  size_t moe_layers = 0;
  for (const auto& [name, entry] : expected_->entries()) {
    if (name.rfind("choices.", 0) != 0) continue;
    const int64_t layer = std::stoll(name.substr(8));
    ASSERT_TRUE(routed.choices.count(layer)) << name;
    EXPECT_TRUE(torch::equal(routed.choices[layer], Expected(name))) << name;
    EXPECT_EQ(routed.expert_tokens[layer].sum().item<int64_t>(), Expected(name).numel()) << name;
    ++moe_layers;
  }
  EXPECT_EQ(moe_layers, routed.choices.size());
  auto loss = *loss_sum / (targets != -100).sum().item<double>();
  EXPECT_LE(RelativeError(loss.detach(), Expected("loss")), 1e-5);
  loss.backward();
  ASSERT_TRUE(params.AfterMicroBatchBackward().ok());
  auto slices = params.ReduceGradients();
  ASSERT_TRUE(slices.ok()) << slices.status().message();

  // One rank: each block's slice is its whole trainable flat, laid out as TrainableLayout says.
  std::map<std::string, torch::Tensor> grad_by_key;
  for (const auto& s : *slices) grad_by_key[s.key] = s.grad;
  size_t compared = 0;
  for (const auto& block : params.TrainableLayout()) {
    ASSERT_TRUE(grad_by_key.count(block.key)) << block.key;
    const torch::Tensor& flat = grad_by_key[block.key];
    for (const auto& p : block.params) {
      auto actual = flat.narrow(0, p.offset - block.optimizer_lo, p.numel).view(p.shape);
      // peft_case.py names a gradient by PEFT's key less "base_model.model.".
      const std::string key = checkpoint::PeftTensorName(p.name, lora.target_modules);
      auto expected = Expected("grad." + key.substr(std::string("base_model.model.").size()));
      ASSERT_TRUE(expected.defined()) << p.name;
      EXPECT_LE(RelativeError(actual, expected), 1e-4) << p.name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, adapter_->entries().size());
}

// The other direction: what the engine writes (fp32, bf16, fp16, with metadata) is read by the
// safetensors package with the same dtypes, shapes, values and metadata.
TEST(SafetensorsInteropTest, FilesTheEngineWritesLoadWithTheSafetensorsPackage) {
  testing::TempDir dir;
  torch::manual_seed(7);
  const std::vector<std::pair<std::string, torch::Tensor>> written = {
      {"fp32", torch::randn({3, 5})},
      {"bf16", torch::randn({4, 2, 3}).to(torch::kBFloat16)},
      {"fp16", torch::randn({7}).to(torch::kFloat16)},
      {"scalar", torch::tensor(2.5f).reshape({})},
  };
  const std::string in = dir.path() + "/engine.safetensors", out = dir.path() + "/back.safetensors";
  ASSERT_TRUE(WriteSafetensors(in, written, {{"format", "pt"}, {"step", "12"}}).ok());
  auto r = tidal::testing::RunProcess(
      {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/hf/safetensors_roundtrip.py", in, out},
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(
      report["dtypes"],
      nlohmann::json(
          {{"fp32", "float32"}, {"bf16", "bfloat16"}, {"fp16", "float16"}, {"scalar", "float32"}}));
  EXPECT_EQ(report["metadata"], nlohmann::json({{"format", "pt"}, {"step", "12"}}));
  auto back = SafetensorsFile::Open(out);
  ASSERT_TRUE(back.ok()) << back.status().message();
  for (const auto& [name, tensor] : written) {
    EXPECT_EQ(report["shapes"][name], nlohmann::json(tensor.sizes().vec())) << name;
    auto value = (*back)->Read(name, torch::kFloat32);
    ASSERT_TRUE(value.ok()) << value.status().message();
    EXPECT_TRUE(torch::equal(*value, tensor.to(torch::kFloat32))) << name;
  }
}

const OracleCase kCases[] = {
    {"UntiedGqa", R"({"tie": false, "kv_heads": 2})"},
    {"TiedGqa", R"({"tie": true, "kv_heads": 2})"},
    {"UntiedMhaRopeTheta5e5", R"({"tie": false, "kv_heads": 4, "rope_theta": 500000.0})"},
    // Weights stored by transformers in 16 bits, and in shards listed by an index.
    {"ShardedBf16", R"({"save_dtype": "bfloat16", "max_shard_size": "40KB", "seed": 1})"},
    {"Fp16", R"({"save_dtype": "float16", "tie": true, "seed": 2})"},
    {"TiedMhaRopeTheta1e6AttentionOnly",
     R"({"tie": true, "kv_heads": 4, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
         "targets": ["q_proj", "v_proj"], "rank": 8, "alpha": 32, "seed": 3})"},
    // Llama-3.1 / R1-Distill-Llama RoPE: long wavelengths stretched by factor, a smooth band.
    {"Llama3Rope",
     R"({"rope": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
         "seed": 4})"},
    {"LinearRope", R"({"rope": {"rope_type": "linear", "factor": 2.0}, "seed": 5})"},
    {"YarnRope",
     R"({"rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
         "tie": true, "seed": 6})"},
    {"LlamaBiasesAndHeadDim",
     R"({"attention_bias": true, "mlp_bias": true, "head_dim": 32, "seed": 7})"},
    // R1-Distill-Qwen: q/k/v with bias, o_proj without.
    {"Qwen2", R"({"family": "qwen2", "rope_theta": 1000000.0, "seed": 8})"},
    {"Qwen2TiedAttentionOnly",
     R"({"family": "qwen2", "tie": true, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
         "seed": 9})"},
    // Qwen3 (R1-0528-Qwen3-8B): RMSNorm on each head's q and k; head_dim apart from hidden/heads.
    {"Qwen3HeadDim", R"({"family": "qwen3", "head_dim": 32, "seed": 10})"},
    {"Qwen3Bias", R"({"family": "qwen3", "attention_bias": true, "tie": true, "seed": 11})"},
    // DeepSeek-V2-Lite's design: no q latent, greedy softmax routing over 8 experts (2 per
    // token) + 2 shared from layer 1 on, yarn RoPE whose mscale_all_dim scales the softmax.
    // gate/up/down_proj: PEFT adapts the routed experts' fused parameters (gate_up at rank 2r).
    {"DeepseekV2LiteGreedy",
     R"({"family": "deepseek_v2", "kv_heads": 4, "layers": 3, "seed": 12,
         "targets": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj",
                     "up_proj", "down_proj"],
         "rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                  "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
         "deepseek": {"q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
                      "num_experts_per_tok": 2, "n_shared_experts": 2,
                      "moe_intermediate_size": 24, "first_k_dense_replace": 1}})"},
    // DeepSeek-V2 proper: a q latent, group-limited routing, biases, tied embeddings.
    {"DeepseekV2GroupLimited",
     R"({"family": "deepseek_v2", "kv_heads": 4, "tie": true, "attention_bias": true,
         "mlp_bias": true, "seed": 13,
         "targets": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                     "gate_proj", "up_proj"],
         "deepseek": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8,
                      "num_experts_per_tok": 3, "n_shared_experts": 1,
                      "moe_intermediate_size": 16, "first_k_dense_replace": 0,
                      "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                      "routed_scaling_factor": 1.5}})"},
    // DeepSeek-V3 / R1: sigmoid scores, the correction bias, groups ranked by their two best,
    // renormalised weights scaled by 2.5.
    {"DeepseekV3NoauxTc",
     R"({"family": "deepseek_v3", "kv_heads": 4, "layers": 3, "seed": 14,
         "targets": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                     "down_proj"],
         "deepseek": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
                      "num_experts_per_tok": 2, "n_shared_experts": 1,
                      "moe_intermediate_size": 16, "first_k_dense_replace": 1, "n_group": 4,
                      "topk_group": 2, "norm_topk_prob": true, "routed_scaling_factor": 2.5}})"},
    // DeepSeek-V3 / R1 as published: FP8 weights with a scale per 128 × 128 block, which the
    // engine dequantizes on load (transformers' own FP8 dequantization gives the expected).
    {"DeepseekV3Fp8",
     R"({"family": "deepseek_v3", "hidden": 128, "intermediate": 256, "heads": 4, "kv_heads": 4,
         "fp8": true, "seed": 16,
         "targets": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
         "deepseek": {"q_lora_rank": 128, "kv_lora_rank": 96, "qk_nope_head_dim": 32,
                      "qk_rope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 4,
                      "num_experts_per_tok": 2, "n_shared_experts": 1,
                      "moe_intermediate_size": 128, "first_k_dense_replace": 1, "n_group": 2,
                      "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5}})"},
    {"DeepseekV3NotInterleaved",
     R"({"family": "deepseek_v3", "kv_heads": 4, "seed": 15,
         "targets": ["q_proj", "kv_b_proj", "o_proj"],
         "deepseek": {"q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4,
                      "num_experts_per_tok": 2, "n_shared_experts": 0,
                      "moe_intermediate_size": 16, "first_k_dense_replace": 0, "n_group": 2,
                      "topk_group": 1, "norm_topk_prob": false, "routed_scaling_factor": 1.0,
                      "rope_interleave": false}})"},
};

INSTANTIATE_TEST_SUITE_P(Families, HfOracleTest,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values(0, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<OracleCase, int>>& info) {
                           return std::string(std::get<0>(info.param).name) + "Zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tidal::engine
