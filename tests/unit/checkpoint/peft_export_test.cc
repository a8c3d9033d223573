// The PEFT adapter export without LibTorch: trainer_state.json's adapter record and its bad
// inputs, PEFT's key names and config fields, the safetensors bytes, and refusals of what PEFT
// would misread. Checkpoints here are written by two "ranks" that each hold half of every
// tensor, as the trainer saves them. (Logits from the exported files: the integration tests.)
#include "worker/checkpoint/peft_export.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "tests/unit/checkpoint/memory_store.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

std::string Floats(int64_t count, float base) {
  std::string out(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    float v = base + 0.25f * static_cast<float>(i);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

AdapterInfo Info() {
  AdapterInfo info;
  info.rank = 2;
  info.alpha = 4;
  info.dropout = 0.05;
  info.target_modules = {"q_proj", "down_proj"};
  info.base_uri = "/models/base";
  return info;
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string bytes;
};

// q_proj [out 6, in 4] and down_proj [out 4, in 8] of layer 0 at r = 2, plus AdamW moments.
std::vector<Tensor> AdapterTensors() {
  return {{"model.layers.0.mlp.down_proj.lora_A.weight", {2, 8}, Floats(16, 1)},
          {"model.layers.0.mlp.down_proj.lora_B.weight", {4, 2}, Floats(8, 2)},
          {"model.layers.0.self_attn.q_proj.lora_A.weight", {2, 4}, Floats(8, 3)},
          {"model.layers.0.self_attn.q_proj.lora_B.weight", {6, 2}, Floats(12, 4)}};
}

json State(const AdapterInfo& info) { return {{"step", 1}, {"adapter", AdapterInfoJson(info)}}; }

// Commits `tensors` (and their optimizer moments) at `step`, split between two shards.
void Save(Repository& repo, int64_t step, const std::vector<Tensor>& tensors, const json& state) {
  std::vector<std::vector<PieceData>> pieces(2);
  std::vector<std::string> moments;
  moments.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    const int64_t n = static_cast<int64_t>(t.bytes.size() / 4), half = n / 2;
    std::string_view all(t.bytes);
    pieces[0].push_back({t.name, "F32", t.shape, 0, all.substr(0, half * 4)});
    pieces[1].push_back({t.name, "F32", t.shape, half, all.substr(half * 4)});
    moments.push_back(Floats(n, -1));
    pieces[0].push_back({"optimizer.exp_avg." + t.name, "F32", t.shape, 0, moments.back()});
  }
  std::vector<BuiltShard> shards;
  for (int r = 0; r < 2; ++r) {
    shards.push_back(*BuildShard(r, 2, pieces[r], 64));
    ASSERT_TRUE(repo.WriteShard(step, shards.back()).ok());
  }
  ASSERT_TRUE(repo.WriteTrainerState(step, state).ok());
  Manifest header;
  header.step = step;
  header.world_size = 2;
  auto manifest = AssembleManifest(header, shards);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  ASSERT_TRUE(repo.Commit(*manifest).ok());
}

class PeftExportTest : public ::testing::Test {
 protected:
  MemoryStore store_, out_;
  Repository repo_{store_};
};

TEST(AdapterInfoTest, RoundTripsThroughTrainerState) {
  AdapterInfo info = Info();
  info.base_uri.clear();
  info.base_preset = "tiny";
  info.base_init_seed = 7;
  info.routed_experts = 64;
  auto back = AdapterInfoFromTrainerState({{"adapter", AdapterInfoJson(info)}});
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->alpha, 4);
  EXPECT_EQ(back->dropout, 0.05);
  EXPECT_EQ(back->target_modules, info.target_modules);
  EXPECT_EQ(back->base_preset, "tiny");
  EXPECT_EQ(back->base_uri, "");
  EXPECT_EQ(back->base_init_seed, 7u);
  EXPECT_EQ(back->routed_experts, 64);
  // A record from before mixture-of-experts adapters: a dense model.
  json old_record = AdapterInfoJson(info);
  old_record.erase("routedExperts");
  auto dense = AdapterInfoFromTrainerState({{"adapter", old_record}});
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  EXPECT_EQ(dense->routed_experts, 0);
}

TEST(AdapterInfoTest, EachBadFieldIsRefusedByName) {
  const json good = AdapterInfoJson(Info());
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"r", 0, "adapter.r: expected a positive integer"},
      {"r", "8", "adapter.r: expected a positive integer"},
      {"loraAlpha", -1, "adapter.loraAlpha: expected a positive number"},
      {"loraDropout", 1.0, "adapter.loraDropout: expected a number in [0, 1)"},
      {"targetModules", json::array(), "adapter.targetModules: expected a non-empty list"},
      {"targetModules", {"q_proj", 3}, "adapter.targetModules: expected non-empty strings"},
      {"baseModel", "x", "adapter.baseModel: expected an object"},
      {"baseModel", {{"uri", "/a"}, {"preset", "tiny"}}, "expected exactly one of uri and preset"},
      {"baseModel", json::object(), "expected exactly one of uri and preset"},
      {"baseModel", {{"preset", "tiny"}, {"initSeed", -1}}, "baseModel.initSeed: expected a non"},
      {"routedExperts", -8, "adapter.routedExperts: expected a non-negative integer"},
      {"routedExperts", "8", "adapter.routedExperts: expected a non-negative integer"},
  };
  for (const Case& c : cases) {
    json bad = good;
    bad[c.field] = c.value;
    auto parsed = AdapterInfoFromTrainerState({{"adapter", bad}});
    ASSERT_FALSE(parsed.ok()) << c.field << " = " << c.value.dump();
    EXPECT_NE(parsed.status().message().find(c.expect), std::string::npos)
        << parsed.status().message();
  }
  auto missing = AdapterInfoFromTrainerState({{"step", 3}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("trainer_state.json: adapter: missing"),
            std::string::npos);
  EXPECT_FALSE(AdapterInfoFromTrainerState(json::array()).ok());
}

TEST(PeftConfigTest, NamesTheFieldsPeftsLoraConfigReads) {
  json config = PeftAdapterConfig(Info());
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 2);
  EXPECT_TRUE(config["lora_alpha"].is_number_integer());  // PEFT declares it an int
  EXPECT_EQ(config["lora_alpha"], 4);
  EXPECT_EQ(config["lora_dropout"], 0.05);
  EXPECT_EQ(config["target_modules"], json({"q_proj", "down_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "/models/base");
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["fan_in_fan_out"], false);
  EXPECT_EQ(config["use_rslora"], false);  // scale is alpha / r, not alpha / sqrt(r)

  EXPECT_EQ(PeftAdapterConfig(Info(), "org/model")["base_model_name_or_path"], "org/model");
  AdapterInfo preset = Info();
  preset.base_uri.clear();
  preset.base_preset = "tiny";
  EXPECT_TRUE(PeftAdapterConfig(preset)["base_model_name_or_path"].is_null());
  preset.alpha = 2.5;
  EXPECT_EQ(PeftAdapterConfig(preset)["lora_alpha"], 2.5);
}

TEST(PeftConfigTest, TensorNamesGetPeftsTwoWrapperPrefixes) {
  EXPECT_EQ(PeftTensorName("model.layers.0.self_attn.q_proj.lora_A.weight", {"q_proj"}),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
}

// PEFT wraps the experts module once per targeted parameter, gate_up_proj first (innermost):
// the outer wrapper's adapter is on the module, the inner one's behind "base_layer".
TEST(PeftConfigTest, RoutedExpertAdaptersAreNamedAsPeftsNestedParamWrappers) {
  const std::string gate_up = "model.layers.1.mlp.experts.gate_up_proj.lora_A.weight",
                    down = "model.layers.1.mlp.experts.down_proj.lora_B.weight";
  const std::vector<std::string> all = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_EQ(PeftTensorName(gate_up, all),
            "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight");
  EXPECT_EQ(PeftTensorName(down, all), "base_model.model.model.layers.1.mlp.experts.lora_B.weight");
  EXPECT_EQ(PeftTensorName(gate_up, {"gate_proj", "up_proj"}),
            "base_model.model.model.layers.1.mlp.experts.lora_A.weight");
  // A dense layer's or a shared expert's projection keeps its own name.
  EXPECT_EQ(PeftTensorName("model.layers.1.mlp.shared_experts.down_proj.lora_A.weight", all),
            "base_model.model.model.layers.1.mlp.shared_experts.down_proj.lora_A.weight");
}

// What PEFT's own conversion of gate/up/down_proj on transformers 5 writes: target_parameters,
// and gate_up_proj at twice the rank and alpha (the same scale).
TEST(PeftConfigTest, RoutedExpertTargetsBecomeTargetParametersWithGateUpAtDoubleRank) {
  AdapterInfo info = Info();
  info.routed_experts = 8;
  info.target_modules = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  json config = PeftAdapterConfig(info);
  EXPECT_EQ(config["target_modules"], json({"q_proj"}));
  EXPECT_EQ(config["target_parameters"], json({"gate_up_proj", "down_proj"}));
  EXPECT_EQ(config["rank_pattern"], json({{".*\\.gate_up_proj", 4}}));
  EXPECT_EQ(config["alpha_pattern"], json({{".*\\.gate_up_proj", 8}}));
  info.target_modules = {"down_proj"};
  config = PeftAdapterConfig(info);
  EXPECT_TRUE(config["target_modules"].is_null());
  EXPECT_EQ(config["target_parameters"], json({"down_proj"}));
  EXPECT_EQ(config["rank_pattern"], json::object());
  // Dense: the names are modules, as before.
  info.routed_experts = 0;
  config = PeftAdapterConfig(info);
  EXPECT_EQ(config["target_modules"], json({"down_proj"}));
  EXPECT_TRUE(config["target_parameters"].is_null());
}

TEST_F(PeftExportTest, RoutedExpertAdaptersExportAtRankTimesExpertsAndAWrongShapeIsRefused) {
  AdapterInfo info = Info();  // r = 2
  info.routed_experts = 3;
  info.target_modules = {"gate_proj", "up_proj", "down_proj"};
  // hidden 4, moe_intermediate_size 2: gate_up [2r·E = 12, 4] / [4, 12]; down [6, 2] / [4, 6].
  const std::vector<Tensor> experts = {
      {"model.layers.1.mlp.experts.down_proj.lora_A.weight", {6, 2}, Floats(12, 1)},
      {"model.layers.1.mlp.experts.down_proj.lora_B.weight", {4, 6}, Floats(24, 2)},
      {"model.layers.1.mlp.experts.gate_up_proj.lora_A.weight", {12, 4}, Floats(48, 3)},
      {"model.layers.1.mlp.experts.gate_up_proj.lora_B.weight", {4, 12}, Floats(48, 4)}};
  Save(repo_, 5, experts, State(info));
  auto exported = ExportPeftAdapter(repo_, std::nullopt, out_, "");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  EXPECT_EQ(exported->tensors, 4u);
  const std::string& file = out_.objects_.at("adapter_model.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[i]);
  json header = json::parse(file.substr(8, header_len));
  EXPECT_EQ(header["base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"]["shape"],
            json({12, 4}));
  EXPECT_EQ(header["base_model.model.model.layers.1.mlp.experts.lora_A.weight"]["shape"],
            json({6, 2}));

  auto wrong = experts;  // gate_up at rank r·E, as if it were one projection
  wrong[2] = {"model.layers.1.mlp.experts.gate_up_proj.lora_A.weight", {6, 4}, Floats(24, 3)};
  wrong[3] = {"model.layers.1.mlp.experts.gate_up_proj.lora_B.weight", {4, 6}, Floats(24, 4)};
  Save(repo_, 9, wrong, State(info));
  auto refused = ExportPeftAdapter(repo_, 9, out_, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("gate_up_proj.lora_A.weight: expected a 2-D [r, "
                                            "in_features] tensor with r = 12 (rank 2 × 2 × 3 "
                                            "routed experts)"),
            std::string::npos)
      << refused.status().message();
}

TEST_F(PeftExportTest, WritesWholeTensorsUnderPeftNamesAndLeavesTheOptimizerOut) {
  Save(repo_, 5, AdapterTensors(), State(Info()));
  auto exported = ExportPeftAdapter(repo_, std::nullopt, out_, "final/");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  EXPECT_EQ(exported->step, 5);
  EXPECT_EQ(exported->tensors, 4u);

  const std::string& file = out_.objects_.at("final/adapter_model.safetensors");
  EXPECT_EQ(exported->bytes, file.size());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[i]);
  ASSERT_EQ((8 + header_len) % 8, 0u);
  json header = json::parse(file.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["__metadata__"]["tidal.step"], "5");
  EXPECT_EQ(header.size(), 5u);  // four tensors and the metadata: no optimizer moments
  const std::string data = file.substr(8 + header_len);
  for (const Tensor& t : AdapterTensors()) {
    const json& entry = header.at(PeftTensorName(t.name, Info().target_modules));
    EXPECT_EQ(entry["dtype"], "F32");
    EXPECT_EQ(entry["shape"], json(t.shape));
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    EXPECT_EQ(data.substr(begin, end - begin), t.bytes) << t.name;
  }
  json config = json::parse(out_.objects_.at("final/adapter_config.json"));
  EXPECT_EQ(config["r"], 2);
}

TEST_F(PeftExportTest, ExportsTheStepAskedForOrSaysItIsNotThere) {
  Save(repo_, 5, AdapterTensors(), State(Info()));
  auto newer = AdapterTensors();
  newer[0].bytes = Floats(16, 100);
  Save(repo_, 9, newer, State(Info()));
  auto exported = ExportPeftAdapter(repo_, 5, out_, "");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  EXPECT_EQ(exported->step, 5);
  EXPECT_EQ(ExportPeftAdapter(repo_, std::nullopt, out_, "")->step, 9);
  auto absent = ExportPeftAdapter(repo_, 7, out_, "");
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("step-00000007"), std::string::npos)
      << absent.status().message();
}

TEST(PeftExportRefusalTest, RefusesWhatPeftWouldMisreadAndWritesNothing) {
  struct Case {
    const char* expect;
    std::function<void(std::vector<Tensor>&, AdapterInfo&)> change;
  };
  const std::vector<Case> cases = {
      {"model.norm.weight: not a LoRA weight",
       [](auto& t, auto&) {
         t.push_back({"model.norm.weight", {4}, Floats(4, 0)});
       }},
      {"\"down_proj\" is not among the adapter's target modules",
       [](auto&, auto& info) { info.target_modules = {"q_proj"}; }},
      {"with r = 3", [](auto&, auto& info) { info.rank = 3; }},
      {"has lora_A but not lora_B", [](auto& t, auto&) { t.erase(t.begin() + 1); }},
  };
  for (const Case& c : cases) {
    std::vector<Tensor> tensors = AdapterTensors();
    AdapterInfo info = Info();
    c.change(tensors, info);
    MemoryStore store, out;
    Repository repo(store);
    Save(repo, 4, tensors, State(info));
    auto exported = ExportPeftAdapter(repo, 4, out, "");
    ASSERT_FALSE(exported.ok()) << c.expect;
    EXPECT_EQ(exported.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(exported.status().message().find(c.expect), std::string::npos)
        << exported.status().message();
    EXPECT_TRUE(out.objects_.empty()) << c.expect;
  }
}

TEST_F(PeftExportTest, ACheckpointWithoutTheAdapterRecordIsRefusedNamingIt) {
  Save(repo_, 3, AdapterTensors(), {{"step", 3}});
  auto exported = ExportPeftAdapter(repo_, 3, out_, "");
  ASSERT_FALSE(exported.ok());
  EXPECT_NE(exported.status().message().find("trainer_state.json: adapter"), std::string::npos);
  EXPECT_TRUE(out_.objects_.empty());
}

TEST_F(PeftExportTest, AFailingOutputStoreFailsTheExportWithItsError) {
  Save(repo_, 5, AdapterTensors(), State(Info()));
  out_.fail_puts_matching_ = "adapter_model";
  auto exported = ExportPeftAdapter(repo_, 5, out_, "final/");
  ASSERT_FALSE(exported.ok());
  EXPECT_NE(exported.status().message().find("No space left"), std::string::npos);
  EXPECT_FALSE(out_.objects_.count("final/adapter_config.json"))
      << "no config pointing at weights that were not written";
}

}  // namespace
}  // namespace tidal::checkpoint
