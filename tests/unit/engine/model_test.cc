// The decoder: presets have the advertised sizes, HF configs and directories load, logits
// from a multi-file HF directory equal the in-memory model's, the model is causal, and merged
// LoRA weights give the adapted model's outputs.
#include "worker/engine/model.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/moe.h"

#include <cmath>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/unit/engine/test_util.h"
#include "worker/engine/comm.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/zero.h"

namespace tidal::engine {
namespace {

using testing::Logits;

using testing::TempDir;

ModelConfig Tiny(bool tied = true) {
  auto c = *PresetModelConfig("tiny");
  c.tie_word_embeddings = tied;
  return c;
}

LoraSpec Lora() {
  LoraSpec l;
  l.rank = 4;
  l.alpha = 8;
  l.target_modules = {"q_proj", "k_proj", "down_proj"};
  return l;
}

TEST(ModelConfigTest, PresetsHaveTheAdvertisedSizes) {
  EXPECT_GE(Tiny().BaseParameterCount(), 1'000'000);
  EXPECT_LE(Tiny().BaseParameterCount(), 5'000'000);
  const auto small = PresetModelConfig("small")->BaseParameterCount();
  EXPECT_GT(small, 80'000'000);
  EXPECT_LT(small, 120'000'000);
  const auto b1 = PresetModelConfig("1b")->BaseParameterCount();
  EXPECT_GT(b1, 1'000'000'000);
  EXPECT_LT(b1, 1'200'000'000);
  // deepseek-llm-7b-base: 6.91 B parameters.
  EXPECT_NEAR(PresetModelConfig("7b")->BaseParameterCount() / 1e9, 6.91, 0.01);
  // The R1 distills' published sizes.
  EXPECT_NEAR(PresetModelConfig("r1-distill-qwen-7b")->BaseParameterCount() / 1e9, 7.62, 0.01);
  EXPECT_NEAR(PresetModelConfig("r1-distill-llama-8b")->BaseParameterCount() / 1e9, 8.03, 0.01);
  EXPECT_NEAR(PresetModelConfig("r1-0528-qwen3-8b")->BaseParameterCount() / 1e9, 8.19, 0.01);
  // DeepSeek-V2-Lite: 15.7 B in all, 2.4 B through which each token passes.
  EXPECT_NEAR(PresetModelConfig("deepseek-v2-lite")->BaseParameterCount() / 1e9, 15.7, 0.05);
  // (2.45 B here: published as 2.4 B.)
  EXPECT_NEAR(PresetModelConfig("deepseek-v2-lite")->ActiveParameterCount() / 1e9, 2.4, 0.06);
  for (const auto& name : PresetNames()) EXPECT_TRUE(PresetModelConfig(name)->Validate().ok());
}

TEST(ModelConfigTest, HfConfigParsesAndRefusesWhatIsNotImplemented) {
  nlohmann::json j = {{"vocab_size", 1000},       {"hidden_size", 64},
                      {"intermediate_size", 128}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"rope_theta", 5e5}};
  auto c = ModelConfigFromHfJson(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_key_value_heads, 4);  // defaults to multi-head attention, as transformers
  EXPECT_EQ(c->rope_theta, 5e5);
  // The pre-transformers-5 form of RoPE scaling: rope_scaling with "type".
  auto scaled = j;
  scaled["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto linear = ModelConfigFromHfJson(scaled);
  ASSERT_TRUE(linear.ok()) << linear.status().message();
  EXPECT_EQ(linear->rope.type, "linear");
  EXPECT_EQ(linear->rope.factor, 2.0);
  scaled["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(ModelConfigFromHfJson(scaled).status().message().find(
                "rope_scaling.rope_type \"dynamic\" is not supported"),
            std::string::npos);
  auto missing = j;
  missing.erase("hidden_size");
  EXPECT_NE(ModelConfigFromHfJson(missing).status().message().find("hidden_size"),
            std::string::npos);
  auto gqa = j;
  gqa["num_key_value_heads"] = 3;
  EXPECT_FALSE(ModelConfigFromHfJson(gqa).ok());
}

// transformers 5 saves RoPE as rope_parameters, with no top-level rope_theta: read it, and
// refuse what would change the computation instead of falling back to θ = 10000.
TEST(ModelConfigTest, Transformers5RopeParametersAreReadOrRefusedByName) {
  nlohmann::json j = {{"vocab_size", 1000},
                      {"hidden_size", 64},
                      {"intermediate_size", 128},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"head_dim", 16},
                      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}}}};
  auto c = ModelConfigFromHfJson(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 5e5);
  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& expect) {
    auto bad = j;
    bad[key] = value;
    auto r = ModelConfigFromHfJson(bad);
    ASSERT_FALSE(r.ok()) << key << " " << value.dump();
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  };
  refused("rope_parameters", {{"rope_type", "longrope"}, {"rope_theta", 5e5}},
          "rope_parameters.rope_type \"longrope\"");
  refused("rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 5e5}},
          "rope_parameters.factor is required");
  refused("rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}, {"factor", 8}},
          "rope_parameters.factor");
  refused("rope_parameters", {{"rope_theta", "big"}}, "rope_parameters.rope_theta");
  refused("rope_theta", 1e4, "rope_theta and rope_parameters.rope_theta differ");
  // head_dim apart from hidden_size / num_attention_heads shapes the projections.
  auto wide = j;
  wide["head_dim"] = 32;
  auto w = ModelConfigFromHfJson(wide);
  ASSERT_TRUE(w.ok()) << w.status().message();
  using Shapes = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(w->ProjectionShapes("q_proj"), (Shapes{{128, 64}}));
  EXPECT_EQ(w->ProjectionShapes("o_proj"), (Shapes{{64, 128}}));
  EXPECT_TRUE(w->ProjectionShapes("kv_b_proj").empty());
}

// Every config.json value that would change the computation in a way the engine does not
// implement is refused naming the field and the value; what the family implies is read.
TEST(ModelConfigTest, EachUnsupportedConfigValueIsRefusedNamingFieldAndValue) {
  const nlohmann::json base = {
      {"model_type", "qwen2"},    {"vocab_size", 1000},          {"hidden_size", 64},
      {"intermediate_size", 128}, {"num_hidden_layers", 2},      {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"use_sliding_window", false}, {"attention_dropout", 0.0},
      {"hidden_act", "silu"},     {"rope_theta", 1e6},           {"max_window_layers", 21},
      {"sliding_window", 4096}};
  auto qwen2 = ModelConfigFromHfJson(base);
  ASSERT_TRUE(qwen2.ok()) << qwen2.status().message();
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_FALSE(qwen2->o_bias);
  EXPECT_FALSE(qwen2->qk_norm);
  auto qwen3_json = base;
  qwen3_json["model_type"] = "qwen3";
  qwen3_json["head_dim"] = 32;
  auto qwen3 = ModelConfigFromHfJson(qwen3_json);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status().message();
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_FALSE(qwen3->qkv_bias);
  EXPECT_EQ(qwen3->head_dim(), 32);
  auto by_architecture = base;
  by_architecture.erase("model_type");
  by_architecture["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_EQ(ModelConfigFromHfJson(by_architecture)->model_type, "qwen3");

  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"model_type", "mistral"}}, "model_type \"mistral\" is not supported"},
      {{{"hidden_act", "gelu"}}, "hidden_act \"gelu\""},
      {{{"use_sliding_window", true}}, "use_sliding_window=true"},
      {{{"layer_types", {"full_attention", "sliding_attention"}}},
       "layer_types \"sliding_attention\""},
      {{{"attention_dropout", 0.1}}, "attention_dropout 0.1"},
      {{{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}}}},
       "rope_parameters.rope_type \"dynamic\""},
      {{{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}, {"low_freq_factor", 1}}}},
       "rope_parameters.low_freq_factor is not supported for rope_type \"yarn\""},
      {{{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}}},
       "rope_parameters.partial_rotary_factor 0.5"},
      {{{"attention_bias", "yes"}}, ""},  // qwen2 ignores it, as transformers does
  };
  for (const auto& [patch, expect] : refused) {
    auto bad = base;
    bad.merge_patch(patch);
    auto r = ModelConfigFromHfJson(bad);
    if (expect.empty()) {
      EXPECT_TRUE(r.ok()) << patch.dump() << ": " << r.status().message();
      continue;
    }
    ASSERT_FALSE(r.ok()) << patch.dump();
    EXPECT_NE(r.status().message().find(expect), std::string::npos)
        << patch.dump() << ": " << r.status().message();
  }
}

// DeepSeek-V2-Lite's config.json as published (the remote-code era: rope_scaling with "type",
// scoring_func, aux_loss_alpha): every key read, the MLA and MoE shapes as transformers builds
// them, and each value the engine does not compute refused by name.
TEST(ModelConfigTest, DeepseekConfigsAreReadAndUnsupportedRoutingIsRefusedByName) {
  const nlohmann::json lite = nlohmann::json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bos_token_id": 100000, "eos_token_id": 100001, "ep_size": 1, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 1.0,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "scoring_func": "softmax", "seq_aux": true, "tie_word_embeddings": false,
    "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
  auto c = ModelConfigFromHfJson(lite);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->uses_mla());
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_EQ(c->RopeDim(), 64);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_EQ(c->rope.type, "yarn");
  // The softmax scale: 1/√192 · (0.1 · 0.707 · ln 40 + 1)², as yarn_apply_mscale.
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(c->AttentionSoftmaxScale(), m * m / std::sqrt(192.0));
  EXPECT_EQ(c->BaseParameterCount(), PresetModelConfig("deepseek-v2-lite")->BaseParameterCount());
  ASSERT_EQ(c->notes.size(), 1u);  // aux_loss_alpha: said, not silently dropped
  EXPECT_NE(c->notes[0].find("aux_loss_alpha"), std::string::npos);
  using Shapes = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(c->ProjectionShapes("kv_b_proj"), (Shapes{{16 * 256, 512}}));
  EXPECT_EQ(c->LoraTargets(),
            (std::vector<std::string>{"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"}));
  // With experts, gate/up/down_proj are each routed expert's (PEFT's target_parameters).
  EXPECT_EQ(c->ProjectionShapes("down_proj"), (Shapes{{2048, 1408}}));
  LoraSpec lora;  // the default targets name k_proj and v_proj, which MLA does not have
  auto refused_targets = CheckLoraFitsModel(lora, *c);
  ASSERT_FALSE(refused_targets.ok());
  EXPECT_NE(refused_targets.message().find("k_proj is not a module of this deepseek_v2 model"),
            std::string::npos)
      << refused_targets.message();
  lora.target_modules = {"q_proj", "gate_proj"};  // one half of the experts' fused gate_up_proj
  refused_targets = CheckLoraFitsModel(lora, *c);
  ASSERT_FALSE(refused_targets.ok());
  EXPECT_NE(refused_targets.message().find(
                "spec.lora.targetModules: gate_proj and up_proj of a mixture-of-experts model"),
            std::string::npos)
      << refused_targets.message();
  lora.target_modules = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  lora.dropout = 0.1;  // PEFT's ParamWrapper takes none
  refused_targets = CheckLoraFitsModel(lora, *c);
  ASSERT_FALSE(refused_targets.ok());
  EXPECT_NE(refused_targets.message().find("spec.lora.dropout: 0.1"), std::string::npos)
      << refused_targets.message();
  lora.target_modules = {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
  EXPECT_TRUE(CheckLoraFitsModel(lora, *c).ok());  // attention-only adapters take dropout
  lora.dropout = 0;
  lora.target_modules = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_TRUE(CheckLoraFitsModel(lora, *c).ok());
  lora.rank = 1025;  // fits each expert's gate (1408 × 2048), not the fused gate_up at 2r
  refused_targets = CheckLoraFitsModel(lora, *c);
  ASSERT_FALSE(refused_targets.ok());
  EXPECT_NE(refused_targets.message().find(
                "spec.lora.rank: 1025 (2050 fused) exceeds the smaller side of the routed experts' "
                "gate_up_proj (gate_proj + up_proj) (2816 × 2048) in this model; use a rank <= "
                "1024"),
            std::string::npos)
      << refused_targets.message();
  lora.rank = 1024;
  EXPECT_TRUE(CheckLoraFitsModel(lora, *c).ok());
  lora.target_modules = {"down_proj"};
  lora.rank = 1409;  // more than an expert's down_proj has (2048 × 1408)
  refused_targets = CheckLoraFitsModel(lora, *c);
  ASSERT_FALSE(refused_targets.ok());
  EXPECT_NE(refused_targets.message().find("spec.lora.rank: 1409 exceeds the smaller side of "
                                           "down_proj (2048 × 1408)"),
            std::string::npos)
      << refused_targets.message();

  auto v3_json = lite;
  v3_json.merge_patch(nlohmann::json::parse(R"({"model_type": "deepseek_v3",
      "architectures": ["DeepseekV3ForCausalLM"], "q_lora_rank": 1536, "n_group": 8,
      "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
      "norm_topk_prob": true, "num_experts_per_tok": 8, "routed_scaling_factor": 2.5,
      "num_nextn_predict_layers": 1, "aux_loss_alpha": null, "seq_aux": null})"));
  auto v3 = ModelConfigFromHfJson(v3_json);
  ASSERT_TRUE(v3.ok()) << v3.status().message();
  EXPECT_TRUE(v3->moe.sigmoid_scores());
  EXPECT_TRUE(v3->moe.norm_topk_prob);
  EXPECT_EQ(v3->mla.q_lora_rank, 1536);
  EXPECT_EQ(v3->notes.size(), 1u);  // the multi-token-prediction layers are not loaded

  const std::vector<std::tuple<nlohmann::json, nlohmann::json, std::string>> refused = {
      {lite,
       {{"topk_method", "noaux_tc"}},
       "topk_method \"noaux_tc\" is not supported for deepseek_v2"},
      {lite, {{"scoring_func", "sigmoid"}}, "scoring_func \"sigmoid\""},
      {lite, {{"norm_topk_prob", true}}, "norm_topk_prob true is not supported for deepseek_v2"},
      {lite, {{"moe_layer_freq", 2}}, "moe_layer_freq 2"},
      {lite, {{"num_key_value_heads", 8}}, "num_key_value_heads (8) must equal"},
      {lite, {{"kv_lora_rank", 0}}, "kv_lora_rank must be > 0"},
      {lite, {{"hidden_act", "gelu"}}, "hidden_act \"gelu\""},
      {lite, {{"num_experts_per_tok", 65}}, "num_experts_per_tok (65) exceeds n_routed_experts"},
      {lite, {{"topk_method", "group_limited_greedy"}, {"n_group", 7}}, "multiple of n_group (7)"},
      {lite, {{"rope_scaling", {{"type", "dynamic"}, {"factor", 2}}}}, "rope_type \"dynamic\""},
      {v3_json,
       {{"topk_method", "greedy"}},
       "topk_method \"greedy\" is not supported for deepseek_v3"},
      {v3_json, {{"scoring_func", "softmax"}}, "scoring_func \"softmax\""},
      {v3_json, {{"n_group", 64}, {"topk_group", 4}}, "at least 2 experts per group"},
      {v3_json,
       {{"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e5m2"}}}},
       "quantization_config.fmt \"e5m2\" is not supported"},
  };
  for (const auto& [base, patch, expect] : refused) {
    auto bad = base;
    bad.merge_patch(patch);
    auto r = ModelConfigFromHfJson(bad);
    ASSERT_FALSE(r.ok()) << patch.dump();
    EXPECT_NE(r.status().message().find(expect), std::string::npos)
        << patch.dump() << ": " << r.status().message();
  }
}

class HfDirectoryTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(HfDirectoryTest, MultiFileDirectoryGivesTheSameLogitsAsTheInMemoryModel) {
  const auto [tied, stage] = GetParam();
  DecoderModel model(Tiny(tied), Lora());
  auto comm = MakeSingleRankComm();
  ShardedParameters original(model, *comm, {stage, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(original.Load(RandomInitReader(model, 11)).ok());
  auto tokens = torch::randint(0, 256, {2, 24}, torch::kInt64);
  auto expected = Logits(original, model, tokens);

  auto named = original.GatherFull();
  ASSERT_TRUE(named.ok());
  std::vector<std::pair<std::string, torch::Tensor>> base;
  for (auto& [name, t] : *named)
    if (name.find(".lora_") == std::string::npos) base.emplace_back(name, t);
  TempDir dir;
  ASSERT_TRUE(WriteHfDirectory(dir.path(), model.config(), base, 400'000).ok());
  ASSERT_TRUE(std::filesystem::exists(dir.path() + "/model.safetensors.index.json"));
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    shards += entry.path().filename().string().starts_with("model-");
  ASSERT_GE(shards, 3) << "the directory should be split into several shard files";

  auto hf = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  DecoderModel loaded_model((*hf)->config(), Lora());
  ShardedParameters loaded(loaded_model, *comm, {stage, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(loaded.Load((*hf)->Reader(loaded_model, 11)).ok());
  EXPECT_TRUE(torch::equal(Logits(loaded, loaded_model, tokens), expected));
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntiedAtStage0And3, HfDirectoryTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 3)));

TEST(HfCheckpointTest, MissingOrMisShapedWeightsAreNamed) {
  DecoderModel model(Tiny(), Lora());
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(params.Load(RandomInitReader(model, 1)).ok());
  auto named = *params.GatherFull();
  std::vector<std::pair<std::string, torch::Tensor>> base;
  for (auto& [name, t] : named)
    if (name.find(".lora_") == std::string::npos && name != "model.norm.weight")
      base.emplace_back(name, t);
  TempDir dir;
  ASSERT_TRUE(WriteHfDirectory(dir.path(), model.config(), base, 1 << 30).ok());
  auto hf = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(hf.ok());
  ShardedParameters again(model, *comm, {0, torch::kCPU, torch::kFloat32});
  Status s = again.Load((*hf)->Reader(model, 1));
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s.message();

  auto wider = Tiny();
  wider.intermediate_size = 256;
  DecoderModel other(wider, Lora());
  ShardedParameters mismatched(other, *comm, {0, torch::kCPU, torch::kFloat32});
  s = mismatched.Load((*hf)->Reader(other, 1));
  EXPECT_NE(s.message().find("shape"), std::string::npos) << s.message();
  EXPECT_EQ(HfCheckpoint::Open(dir.path() + "/nope").status().code(), StatusCode::kNotFound);
}

TEST(ModelTest, OutputsAtAPositionDoNotDependOnLaterTokens) {
  DecoderModel model(Tiny(), Lora());
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(params.Load(RandomInitReader(model, 3)).ok());
  auto tokens = torch::randint(0, 256, {1, 16}, torch::kInt64);
  auto changed = tokens.clone();
  changed.index_put_({0, 12}, (tokens.index({0, 12}) + 1) % 256);
  auto a = Logits(params, model, tokens), b = Logits(params, model, changed);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 12), b.narrow(1, 0, 12)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 12, 4), b.narrow(1, 12, 4)));
}

// Merges `lora` on `config` and checks the merged plain model against the adapted one.
void ExpectMergeReproducesTheAdaptedModel(const ModelConfig& config, const LoraSpec& lora) {
  DecoderModel model(config, lora);
  auto comm = MakeSingleRankComm();
  ShardedParameters adapted(model, *comm, {0, torch::kCPU, torch::kFloat32});
  // Non-zero B so that the adapters matter.
  auto init = RandomInitReader(model, 5);
  ASSERT_TRUE(adapted
                  .Load([&](const ParamSpec& spec, int64_t first,
                            int64_t count) -> StatusOr<torch::Tensor> {
                    if (spec.name.find("lora_B") != std::string::npos)
                      return torch::randn({count}) * 0.05;
                    return init(spec, first, count);
                  })
                  .ok());
  auto tokens = torch::randint(0, 256, {2, 20}, torch::kInt64);
  auto expected = Logits(adapted, model, tokens);

  std::vector<std::string> changed;
  auto merged =
      MergeLora(*adapted.GatherFull(), model.lora(), config.moe.n_routed_experts, &changed);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_FALSE(changed.empty());
  std::map<std::string, torch::Tensor> by_name(merged->begin(), merged->end());
  LoraSpec none = lora;
  none.target_modules.clear();
  DecoderModel plain(config, none);
  ShardedParameters merged_params(plain, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(merged_params
                  .Load([&](const ParamSpec& spec, int64_t first,
                            int64_t count) -> StatusOr<torch::Tensor> {
                    return by_name.at(spec.name).reshape({-1}).narrow(0, first, count);
                  })
                  .ok());
  auto actual = Logits(merged_params, plain, tokens);
  // The adapters matter: the base weights alone give other outputs.
  ShardedParameters base_only(plain, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(base_only.Load(init).ok());
  EXPECT_FALSE(torch::allclose(Logits(base_only, plain, tokens), expected, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-4, 1e-5))
      << (actual - expected).abs().max().item<double>();
}

TEST(ModelTest, MergedLoraWeightsReproduceTheAdaptedModel) {
  ExpectMergeReproducesTheAdaptedModel(Tiny(), Lora());
}

// Each routed expert's weights take its slice of the experts' fused adapters (gate_up at rank
// 2r: gate's rows first), whichever of them are targeted.
TEST(ModelTest, MergedExpertAdaptersReproduceTheAdaptedMixtureOfExperts) {
  ModelConfig v2 = Tiny(false);
  v2.model_type = "deepseek_v2", v2.num_key_value_heads = v2.num_attention_heads;
  v2.mla = {0, 32, 16, 16, 24, true};
  v2.moe.n_routed_experts = 4, v2.moe.num_experts_per_tok = 2, v2.moe.n_shared_experts = 1;
  v2.moe.moe_intermediate_size = 32, v2.moe.first_k_dense_replace = 1;
  for (const std::vector<std::string>& targets :
       {std::vector<std::string>{"q_proj", "gate_proj", "up_proj", "down_proj"},
        std::vector<std::string>{"gate_proj", "up_proj"}, std::vector<std::string>{"down_proj"}}) {
    SCOPED_TRACE(nlohmann::json(targets).dump());
    LoraSpec lora = Lora();
    lora.dropout = 0;
    lora.target_modules = targets;
    ASSERT_TRUE(CheckLoraFitsModel(lora, v2).ok());
    ExpectMergeReproducesTheAdaptedModel(v2, lora);
  }
}

// A fused experts' adapter whose shape does not fit the experts is refused, not sliced wrong.
TEST(ModelTest, MergeRefusesAnExpertsAdapterOfTheWrongShape) {
  LoraSpec lora = Lora();  // rank 4
  const std::vector<std::pair<std::string, torch::Tensor>> named = {
      {"model.layers.1.mlp.experts.0.down_proj.weight", torch::zeros({8, 16})},
      {"model.layers.1.mlp.experts.down_proj.lora_A.weight", torch::zeros({12, 16})},
      {"model.layers.1.mlp.experts.down_proj.lora_B.weight", torch::zeros({8, 12})}};
  auto merged = MergeLora(named, lora, /*routed_experts=*/4);  // rank · experts is 16, not 12
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("down_proj adapter is not [16, in] / [out, 16]"),
            std::string::npos)
      << merged.status().message();
}

}  // namespace
}  // namespace tidal::engine

namespace tidal::engine {
namespace {

// Gate and up back to back in one buffer (ZeRO's block layout) run as one GEMM; apart, as two:
// the same values either way.
TEST(MoeTest, AnExpertGivesTheSameOutputWhetherItsGateAndUpAreFusedOrApart) {
  torch::manual_seed(5);
  const auto x = torch::randn({7, 16});
  auto flat = torch::randn({3 * 24 * 16});
  auto gate = flat.narrow(0, 0, 24 * 16).view({24, 16});
  auto up = flat.narrow(0, 24 * 16, 24 * 16).view({24, 16});
  auto down = flat.narrow(0, 2 * 24 * 16, 24 * 16).view({16, 24});
  namespace F = torch::nn::functional;
  const auto expected = F::linear(F::silu(F::linear(x, gate)) * F::linear(x, up), down);
  EXPECT_TRUE(torch::allclose(ExpertMlp(x, gate, up, down), expected, 1e-5, 1e-6));
  // Apart (up before gate in memory, or separate tensors): the plain path.
  EXPECT_TRUE(torch::allclose(ExpertMlp(x, gate.clone(), up.clone(), down), expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ExpertMlp(x, up, gate, down),
                              F::linear(F::silu(F::linear(x, up)) * F::linear(x, gate), down), 1e-5,
                              1e-6));
}

}  // namespace
}  // namespace tidal::engine

namespace tidal::engine {
namespace {

// tidal-train --dry-run counts parameters per block without LibTorch: the same numbers as the
// blocks the model declares, family by family, frozen and trainable.
TEST(MemoryPlanTest, BlockCountsAreTheModelsBlocksForEveryFamily) {
  ModelConfig tiny = *PresetModelConfig("tiny");
  ModelConfig qwen3 = tiny;
  qwen3.model_type = "qwen3", qwen3.qk_norm = true, qwen3.head_dim_override = 48;
  qwen3.qkv_bias = qwen3.o_bias = true, qwen3.tie_word_embeddings = false;
  ModelConfig v2 = tiny;
  v2.model_type = "deepseek_v2", v2.num_key_value_heads = v2.num_attention_heads;
  v2.mla = {0, 32, 16, 16, 24, true};
  v2.moe.n_routed_experts = 8, v2.moe.num_experts_per_tok = 2, v2.moe.n_shared_experts = 2;
  v2.moe.moe_intermediate_size = 64, v2.moe.first_k_dense_replace = 1, v2.mlp_bias = true;
  ModelConfig v3 = v2;
  v3.model_type = "deepseek_v3", v3.mla.q_lora_rank = 48, v3.o_bias = true, v3.mlp_bias = false;
  v3.moe.topk_method = "noaux_tc", v3.moe.n_group = 4, v3.moe.topk_group = 2;
  const std::vector<std::pair<ModelConfig, std::vector<std::string>>> cases = {
      {tiny, {"q_proj", "v_proj", "down_proj"}},
      {qwen3, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
      {v2,
       {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj",
        "down_proj"}},
      {v3, {"q_a_proj", "q_b_proj", "kv_b_proj", "down_proj"}},
  };
  for (const auto& [config, targets] : cases) {
    LoraSpec lora{.rank = 4, .target_modules = targets};
    DecoderModel model(config, lora);
    const auto counts = BlockParameterCounts(config, lora);
    ASSERT_EQ(counts.size(), model.blocks().size()) << config.model_type;
    int64_t total = 0;
    for (size_t b = 0; b < counts.size(); ++b) {
      int64_t frozen = 0, trainable = 0;
      for (const ParamSpec& p : model.blocks()[b].params)
        (p.trainable ? trainable : frozen) += p.numel();
      EXPECT_EQ(counts[b].frozen, frozen) << config.model_type << " block " << b;
      EXPECT_EQ(counts[b].trainable, trainable) << config.model_type << " block " << b;
      total += frozen;
    }
    EXPECT_EQ(total, config.BaseParameterCount()) << config.model_type;
  }
}

}  // namespace
}  // namespace tidal::engine

namespace tidal::engine {
namespace {

// DeepSeek-V3's FP8 layout with blocks that do not divide the weight (192 rows, 128-blocks:
// the last block row is partial, as in V3's kv_a_proj_with_mqa): any range dequantizes with the
// scale of the block each element is in; a FP8 weight without its scale is refused by name.
TEST(Fp8Test, PartialBlocksDequantizeWithTheirOwnScaleOverAnyRange) {
  testing::TempDir dir;
  ModelConfig config = *PresetModelConfig("tiny");  // hidden 192
  DecoderModel model(config, LoraSpec{.target_modules = {}});
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& block : model.blocks())
    for (const auto& p : block.params) named.emplace_back(p.name, model.InitialValue(p, 1));
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  torch::manual_seed(2);
  auto w = torch::randn({192, 192});
  auto fp8 = w.to(torch::kFloat8_e4m3fn);
  auto scales = torch::rand({2, 2}) + 0.5;  // ⌈192/128⌉ = 2 block rows and columns
  for (auto& [name, t] : named)
    if (name == q) t = fp8;
  named.emplace_back(q + "_scale_inv", scales);
  ASSERT_TRUE(WriteHfDirectory(dir.path(), config, named, 1 << 30).ok());
  auto json = nlohmann::json::parse(std::ifstream(dir.path() + "/config.json"));
  json["quantization_config"] = {{"quant_method", "fp8"},
                                 {"fmt", "e4m3"},
                                 {"activation_scheme", "dynamic"},
                                 {"weight_block_size", {128, 128}}};
  std::ofstream(dir.path() + "/config.json") << json.dump();

  auto hf = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  auto reader = (*hf)->Reader(model, 0);
  const ParamSpec* spec = nullptr;
  for (const auto& p : model.blocks()[1].params)
    if (p.name == q) spec = &p;
  ASSERT_NE(spec, nullptr);
  const auto expected =
      (fp8.to(torch::kFloat32) *
       scales.repeat_interleave(128, 0).repeat_interleave(128, 1).narrow(0, 0, 192).narrow(1, 0,
                                                                                           192))
          .reshape({-1});
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 192 * 192},
                              {127 * 192 + 100, 500},
                              {150 * 192 + 130, 7000}}) {
    auto got = reader(*spec, first, count);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_TRUE(torch::equal(*got, expected.narrow(0, first, count))) << first;
  }

  // The same weight without its scale, or without quantization_config: refused by name.
  json.erase("quantization_config");
  std::ofstream(dir.path() + "/config.json") << json.dump();
  auto plain = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(plain.ok());
  auto refused = (*plain)->Reader(model, 0)(*spec, 0, 10);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("stored in FP8 but config.json has no "
                                            "quantization_config"),
            std::string::npos)
      << refused.status().message();
  json["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_NE(ModelConfigFromHfJson(json).status().message().find(
                "quantization_config.quant_method \"awq\" is not supported"),
            std::string::npos);
}

}  // namespace
}  // namespace tidal::engine
