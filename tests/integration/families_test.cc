// Each family as a user runs it (Qwen2, Qwen3, Llama-3, DeepSeek-V2 and V3 with latent
// attention and experts): an HF directory of the family (written by the engine, so
// its config.json must be what transformers reads), fine-tuned by tidal-train at 1 rank and at
// 2 ranks under ZeRO-3 — the same losses — then exported: PEFT applies the adapter onto the
// transformers model of that family, and transformers loads the merged directory, each giving
// the engine's logits.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

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
namespace fs = std::filesystem;
using tidal::testing::ProcessResult;
using tidal::testing::RunProcess;

struct Family {
  const char* name;
  ModelConfig config;
  std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
};

void PrintTo(const Family& family, std::ostream* os) { *os << family.name; }

// The tiny preset's shape in each family, with what sets it apart.
std::vector<Family> Families() {
  ModelConfig tiny = *PresetModelConfig("tiny");
  tiny.tie_word_embeddings = false;
  ModelConfig qwen2 = tiny, qwen3 = tiny, llama3 = tiny;
  qwen2.model_type = "qwen2", qwen2.qkv_bias = true, qwen2.rope_theta = 1e6;
  qwen3.model_type = "qwen3", qwen3.qk_norm = true, qwen3.head_dim_override = 48;
  qwen3.rope.type = "yarn", qwen3.rope.factor = 4, qwen3.rope.original_max_position_embeddings = 8;
  llama3.rope_theta = 5e5, llama3.rope.type = "llama3", llama3.rope.factor = 8;
  llama3.rope.original_max_position_embeddings = 16, llama3.o_bias = llama3.qkv_bias = true;
  // DeepSeek-V2-Lite's design (no q latent, greedy softmax routing, yarn with mscale) and V3's
  // (q latent, sigmoid scores with the correction bias, groups, renormalised and scaled).
  ModelConfig v2 = tiny;
  v2.model_type = "deepseek_v2", v2.num_key_value_heads = v2.num_attention_heads;
  v2.mla = {0, 32, 16, 16, 24, true};
  v2.moe.n_routed_experts = 8, v2.moe.num_experts_per_tok = 2, v2.moe.n_shared_experts = 2;
  v2.moe.moe_intermediate_size = 64, v2.moe.first_k_dense_replace = 1;
  v2.rope.type = "yarn", v2.rope.factor = 4, v2.rope.original_max_position_embeddings = 8;
  v2.rope.mscale = 0.707, v2.rope.mscale_all_dim = 0.707;
  ModelConfig v3 = v2;
  v3.model_type = "deepseek_v3", v3.mla.q_lora_rank = 48, v3.rope = RopeScaling{};
  v3.moe.topk_method = "noaux_tc", v3.moe.n_group = 4, v3.moe.topk_group = 2;
  v3.moe.n_shared_experts = 1, v3.moe.norm_topk_prob = true, v3.moe.routed_scaling_factor = 2.5;
  return {
      {"Qwen2", qwen2},
      {"Qwen3", qwen3},
      {"Llama3", llama3},
      // With experts, gate/up/down_proj adapt the routed experts (PEFT's target_parameters).
      {"DeepseekV2",
       v2,
       {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj",
        "down_proj"}},
      {"DeepseekV3", v3, {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}}};
}

std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// A list field of every step line tidal-train printed.
std::vector<nlohmann::json> StepField(const std::string& out, const std::string& key) {
  std::vector<nlohmann::json> values;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss") && j.contains(key)) values.push_back(j[key]);
  }
  return values;
}

::testing::AssertionResult Close(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shapes differ";
  if (torch::allclose(actual, expected, 1e-4, 1e-5)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max abs difference " << (actual - expected).abs().max().item<double>();
}

class FamilyTest : public ::testing::TestWithParam<Family> {
 protected:
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_ = [] {
    std::string tmpl = (fs::temp_directory_path() / "tidal-family-XXXXXX").string();
    return std::string(mkdtemp(tmpl.data()));
  }();
};

TEST_P(FamilyTest, TrainsTheSameAtOneAndTwoRanksAndItsExportsLoadInTransformersAndPeft) {
  const ModelConfig& config = GetParam().config;
  ASSERT_TRUE(
      WriteHfDirectory(dir_ + "/base", config, testing::RandomBaseWeights(config), 1'000'000'000)
          .ok());

  const std::vector<std::string>& targets = GetParam().targets;
  std::ofstream(dir_ + "/job.yaml")
      << "model: {uri: " << dir_ << "/base}\n"
      << "dataset: {uri: " << TIDAL_SOURCE_DIR
      << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32, tokenizer: bytes,"
      << " preparedUri: " << dir_ << "/tokens}\n"
      << "lora: {rank: 4, alpha: 8, dropout: 0.0, targetModules: " << nlohmann::json(targets)
      << "}\n"
      << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 1,"
      << " learningRate: 5.0e-3, maxSteps: 5, seed: 2}\n";
  auto train = [&](const std::string& nproc) {
    return RunProcess({TIDAL_TRAIN_BIN, "--config", dir_ + "/job.yaml", "--nproc", nproc,
                       "--checkpoint-uri", dir_ + "/ckpt-" + nproc, "--full-every", "5"},
                      300s);
  };
  const ProcessResult one = train("1"), two = train("2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  // --dry-run's parameter bytes per rank are what each rank then allocated.
  const ProcessResult plan = RunProcess(
      {TIDAL_TRAIN_BIN, "--config", dir_ + "/job.yaml", "--nproc", "2", "--dry-run"}, 60s);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const auto planned = nlohmann::json::parse(plan.out);
  EXPECT_EQ(planned["params_total"], config.BaseParameterCount());
  const auto ready = testing::JsonLines(two.err, "engine ready");
  EXPECT_EQ(ready.size(), 2u) << two.err;
  for (const auto& j : ready) {
    EXPECT_EQ(j["resident_param_bytes"], planned["per_rank_bytes"]["resident_params"]) << j;
    EXPECT_EQ(j["params_trainable"], planned["params_trainable"]) << j;
  }
  const std::vector<double> a = Losses(one.out), b = Losses(two.out);
  ASSERT_EQ(a.size(), 5u) << one.out;
  ASSERT_EQ(b.size(), a.size()) << two.out;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  if (config.moe.n_routed_experts > 0) {
    // Each step's load per expert is the whole job's: the same at 1 and 2 ranks, every token
    // counted once per expert it chose in each MoE layer.
    const auto one_loads = StepField(one.out, "expert_tokens"),
               two_loads = StepField(two.out, "expert_tokens");
    ASSERT_EQ(one_loads.size(), a.size()) << one.out;
    EXPECT_EQ(two_loads, one_loads);
    const int64_t moe_layers = config.num_hidden_layers - config.moe.first_k_dense_replace;
    for (const nlohmann::json& json_load : one_loads) {
      const auto load = json_load.get<std::vector<int64_t>>();
      ASSERT_EQ(load.size(), static_cast<size_t>(config.moe.n_routed_experts));
      const int64_t routed = std::accumulate(load.begin(), load.end(), int64_t{0});
      EXPECT_GT(routed, 0);
      EXPECT_EQ(routed % (config.moe.num_experts_per_tok * moe_layers), 0) << routed;
    }
    EXPECT_EQ(StepField(one.out, "moe_imbalance")[0].size(), static_cast<size_t>(moe_layers));
  }

  // The engine's logits with the final adapter (PEFT's file, by the export's names).
  const std::string adapter_dir = dir_ + "/ckpt-2/final";
  auto hf = HfCheckpoint::Open(dir_ + "/base");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  DecoderModel model((*hf)->config(), LoraSpec{.rank = 4, .alpha = 8, .target_modules = targets});
  auto adapter = SafetensorsFile::Open(adapter_dir + "/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  ParameterReader base_reader = (*hf)->Reader(model, 0);
  ASSERT_TRUE(params
                  .Load([&](const ParamSpec& spec, int64_t first,
                            int64_t count) -> StatusOr<torch::Tensor> {
                    if (!spec.trainable) return base_reader(spec, first, count);
                    return (*adapter)->ReadFlatRange(checkpoint::PeftTensorName(spec.name, targets),
                                                     first, count, torch::kFloat32);
                  })
                  .ok());
  const torch::Tensor tokens = torch::randint(0, 256, {2, 24}, torch::kInt64);
  const torch::Tensor expected = testing::Logits(params, model, tokens);
  ASSERT_TRUE(WriteSafetensors(dir_ + "/tokens.safetensors", {{"tokens", tokens}}, {}).ok());

  ProcessResult merged = RunProcess(
      {TIDAL_EXPORT_BIN, "--merge", "--checkpoint", dir_ + "/ckpt-2", "--out", dir_ + "/merged"},
      120s);
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  // PEFT's adapter on transformers' base, and transformers' load of the merged model: one
  // process, the libraries loaded once.
  const std::string script = std::string(TIDAL_SOURCE_DIR) + "/tests/hf/export_logits.py";
  ProcessResult libraries =
      RunProcess({TIDAL_PYTHON, script, "adapter", dir_ + "/base", adapter_dir,
                  dir_ + "/tokens.safetensors", dir_ + "/peft.safetensors", "--", "merged",
                  dir_ + "/merged", dir_ + "/tokens.safetensors", dir_ + "/merged.safetensors"},
                 300s);
  ASSERT_EQ(libraries.exit_code, 0) << libraries.out << libraries.err;
  auto peft_logits = SafetensorsFile::Open(dir_ + "/peft.safetensors");
  ASSERT_TRUE(peft_logits.ok());
  EXPECT_TRUE(Close(*(*peft_logits)->Read("logits", torch::kFloat32), expected));
  auto merged_logits = SafetensorsFile::Open(dir_ + "/merged.safetensors");
  ASSERT_TRUE(merged_logits.ok());
  EXPECT_TRUE(Close(*(*merged_logits)->Read("logits", torch::kFloat32), expected));
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::ValuesIn(Families()),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace tidal::engine
