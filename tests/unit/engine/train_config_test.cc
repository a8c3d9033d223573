// The spec as the engine reads it: defaults, whole-TrainingJob input, and a clear message
// naming the field for each kind of bad input.
#include "api/train_config.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <set>

#include "common/yaml_json.h"
#include "worker/engine/model_config.h"

namespace tidal::engine {
namespace {

StatusOr<TrainConfig> Parse(const std::string& yaml) {
  auto json = ParseYaml(yaml);
  if (!json.ok()) return json.status();
  return TrainConfigFromJson(*json, "/base");
}

constexpr const char* kValid = R"(
model: {preset: tiny}
dataset: {uri: data/x.jsonl, maxSeqLen: 64}
lora: {rank: 8, alpha: 16, targetModules: [q_proj, v_proj]}
optimization: {zeroStage: 2, globalBatchSize: 16, microBatchSize: 2, learningRate: 1.0e-3}
elastic: {minGPUs: 1, maxGPUs: 4}
)";

std::string ErrorOf(const std::string& yaml) {
  auto c = Parse(yaml);
  EXPECT_FALSE(c.ok()) << "expected an error for:\n" << yaml;
  return c.ok() ? "" : c.status().message();
}

TEST(TrainConfigTest, ValidSpecParsesAndResolvesRelativePaths) {
  auto c = Parse(kValid);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.preset, "tiny");
  EXPECT_EQ(c->dataset.uri, "/base/data/x.jsonl");
  EXPECT_EQ(c->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c->optimization.zero_stage, 2);
  EXPECT_EQ(c->GradientAccumulation(4), 2);
}

TEST(TrainConfigTest, WholeTrainingJobManifestUsesItsSpecAndName) {
  auto c =
      Parse(std::string("apiVersion: tidal.dev/v1alpha1\nkind: TrainingJob\n"
                        "metadata: {name: demo}\nspec:\n  model: {preset: tiny}\n"
                        "  dataset: {uri: file:///data/x.jsonl}\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->name, "demo");
  EXPECT_EQ(c->dataset.uri, "/data/x.jsonl");
}

TEST(TrainConfigTest, UnknownPresetNamesTheFieldAndTheChoices) {
  auto msg = ErrorOf("model: {preset: huge}\ndataset: {uri: x.jsonl}\n");
  EXPECT_NE(msg.find("spec.model.preset"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny, small, 1b, 7b"), std::string::npos) << msg;
}

TEST(TrainConfigTest, UnknownTargetModuleNamesItsIndex) {
  auto msg = ErrorOf(
      "model: {preset: tiny}\ndataset: {uri: x.jsonl}\n"
      "lora: {targetModules: [q_proj, qkv_proj]}\n");
  EXPECT_NE(msg.find("spec.lora.targetModules[1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qkv_proj"), std::string::npos) << msg;
}

TEST(TrainConfigTest, EveryViolationIsReportedWithItsPath) {
  auto msg = ErrorOf(
      "model: {preset: tiny}\ndataset: {uri: x.jsonl, maxSeqLen: 0}\n"
      "lora: {rank: 0, dropout: 1.5}\n"
      "optimization: {zeroStage: 5, precision: fp8, learningRate: -1, "
      "learningrate: 3}\n");
  for (const char* field :
       {"spec.dataset.maxSeqLen", "spec.lora.rank", "spec.lora.dropout",
        "spec.optimization.zeroStage", "spec.optimization.precision",
        "spec.optimization.learningRate", "spec.optimization.learningrate: unknown field"})
    EXPECT_NE(msg.find(field), std::string::npos) << field << " not in:\n" << msg;
}

TEST(TrainConfigTest, WrongTypesAreNamed) {
  auto msg = ErrorOf(
      "model: {preset: tiny}\ndataset: {uri: x.jsonl}\nlora: {rank: eight}\n"
      "optimization: [1, 2]\n");
  EXPECT_NE(msg.find("spec.lora.rank: expected an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("spec.optimization: expected an object"), std::string::npos) << msg;
}

TEST(TrainConfigTest, ModelNeedsExactlyOneOfUriAndPreset) {
  EXPECT_NE(ErrorOf("dataset: {uri: x.jsonl}\n").find("spec.model"), std::string::npos);
  EXPECT_NE(
      ErrorOf("model: {preset: tiny, uri: /m}\ndataset: {uri: x.jsonl}\n").find("exactly one"),
      std::string::npos);
}

TEST(TrainConfigTest, MissingDatasetAndUnsupportedSchemeAreNamed) {
  EXPECT_NE(ErrorOf("model: {preset: tiny}\n").find("spec.dataset"), std::string::npos);
  auto msg = ErrorOf("model: {preset: tiny}\ndataset: {uri: \"http://b/x.jsonl\"}\n");
  EXPECT_NE(msg.find("spec.dataset.uri"), std::string::npos) << msg;
}

TEST(TrainConfigTest, DatasetFieldsAreReadAndEachBadOneIsNamed) {
  auto c = Parse(
      "model: {preset: tiny}\n"
      "dataset: {uri: \"s3://b/chat.jsonl\", format: messages, maxSeqLen: 64, overlong: drop,\n"
      "  packing: false, strict: true, tokenizer: bytes, preparedUri: \"s3://b/tokens\",\n"
      "  loader: {lookahead: 8, cacheDir: /var/cache/tidal, cacheMaxMiB: 512, warmupPercent: "
      "5}}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->dataset.uri, "s3://b/chat.jsonl");  // s3:// is kept as it is
  EXPECT_EQ(c->dataset.format, "messages");
  EXPECT_EQ(c->dataset.overlong, "drop");
  EXPECT_FALSE(c->dataset.packing);
  EXPECT_TRUE(c->dataset.strict);
  EXPECT_EQ(c->dataset.tokenizer, "bytes");
  EXPECT_EQ(c->dataset.prepared_uri, "s3://b/tokens");
  EXPECT_EQ(c->dataset.lookahead, 8);
  EXPECT_EQ(c->dataset.cache_dir, "/var/cache/tidal");
  EXPECT_EQ(c->dataset.cache_max_mib, 512);
  EXPECT_EQ(c->dataset.warmup_percent, 5);
  const std::string base = "model: {preset: tiny}\ndataset: {uri: x.jsonl, ";
  for (auto [field, words] : std::vector<std::pair<std::string, std::string>>{
           {"format: csv}", "spec.dataset.format"},
           {"overlong: wrap}", "spec.dataset.overlong"},
           {"tokenizer: \"http://x/tok\"}", "spec.dataset.tokenizer"},
           {"packing: 1}", "spec.dataset.packing"},
           {"strict: \"yes\"}", "spec.dataset.strict"},
           {"loader: {lookahead: 0}}", "spec.dataset.loader.lookahead"},
           {"loader: {warmupPercent: 101}}", "spec.dataset.loader.warmupPercent"},
           {"loader: {cacheMaxMiB: 0}}", "spec.dataset.loader.cacheMaxMiB"},
           {"loader: {cache: x}}", "spec.dataset.loader.cache"},
           {"loader: 3}", "spec.dataset.loader"}}) {
    auto msg = ErrorOf(base + field + "\n");
    EXPECT_NE(msg.find(words), std::string::npos) << field << " → " << msg;
  }
}

TEST(TrainConfigTest, WorldSizeThatDoesNotDivideTheGlobalBatchIsRefused) {
  auto c = Parse(kValid);  // global 16, micro 2
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->ValidateForWorldSize(4).ok());
  Status s = c->ValidateForWorldSize(3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("spec.optimization.globalBatchSize"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("2 × 3 = 6"), std::string::npos) << s.message();
}

TEST(TrainConfigTest, GradientCompressionIsOffByDefaultAndTopkReadsItsFields) {
  auto off = Parse(kValid);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->optimization.gradient_compression.enabled());
  auto on = Parse(R"(
model: {preset: tiny}
dataset: {uri: data/x.jsonl}
optimization:
  zeroStage: 1
  globalBatchSize: 24
  gradientCompression: {method: topk, ratio: 0.01, warmupSteps: 3, groups: 4}
)");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  const auto& gc = on->optimization.gradient_compression;
  EXPECT_TRUE(gc.enabled());
  EXPECT_DOUBLE_EQ(gc.ratio, 0.01);
  EXPECT_EQ(gc.warmup_steps, 3);
  EXPECT_EQ(gc.GroupsAt(2), 4);
  EXPECT_TRUE(on->ValidateForWorldSize(2).ok());
  EXPECT_TRUE(on->ValidateForWorldSize(4).ok());
  // 8 ranks cannot hold 4 groups; 3 does not divide them (both split the batch of 24).
  for (int world : {3, 8}) {
    Status s = on->ValidateForWorldSize(world);
    ASSERT_FALSE(s.ok()) << world;
    EXPECT_NE(s.message().find("spec.optimization.gradientCompression.groups: 4"),
              std::string::npos)
        << s.message();
  }
  // 16 groups of 24 micro-batches: not whole.
  auto uneven = *on;
  uneven.optimization.gradient_compression.groups = 16;
  Status s = uneven.ValidateForWorldSize(4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("divide globalBatchSize / microBatchSize = 24"), std::string::npos)
      << s.message();
}

TEST(TrainConfigTest, EachBadGradientCompressionFieldIsNamed) {
  auto with = [](const std::string& compression, int stage = 2) {
    return "model: {preset: tiny}\ndataset: {uri: data/x.jsonl}\noptimization: {zeroStage: " +
           std::to_string(stage) + ", gradientCompression: " + compression + "}\n";
  };
  EXPECT_NE(ErrorOf(with("{method: randk}")).find("gradientCompression.method"), std::string::npos);
  for (const char* ratio : {"0", "-0.5", "1.5", "\"half\""})
    EXPECT_NE(ErrorOf(with(std::string("{method: topk, ratio: ") + ratio + "}"))
                  .find("spec.optimization.gradientCompression.ratio"),
              std::string::npos)
        << ratio;
  EXPECT_NE(ErrorOf(with("{method: topk, warmupSteps: -1}"))
                .find("spec.optimization.gradientCompression.warmupSteps"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with("{method: topk, groups: -2}"))
                .find("spec.optimization.gradientCompression.groups"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with("{method: topk, rate: 0.1}")).find("gradientCompression.rate"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with("topk")).find("spec.optimization.gradientCompression"), std::string::npos);
  // Stage 3 keeps only a shard of each gradient: refused with the reason and the way out.
  const std::string stage3 = ErrorOf(with("{method: topk}", 3));
  EXPECT_NE(stage3.find("spec.optimization.gradientCompression.method: topk needs zeroStage 0, "
                        "1 or 2"),
            std::string::npos)
      << stage3;
  // Off at stage 3 is fine.
  EXPECT_TRUE(Parse(with("{method: none}", 3)).ok());
}

TEST(TrainConfigTest, ManifestWithWrongKindOrNonStringFieldsIsRefusedNotCrashed) {
  EXPECT_NE(ErrorOf("kind: 3\nspec: {}\n").find("kind: expected TrainingJob"), std::string::npos);
  EXPECT_NE(ErrorOf("apiVersion: tidal.dev/v1alpha1\nspec: {}\n").find("kind"), std::string::npos);
  EXPECT_NE(ErrorOf("kind: TrainingJob\n").find("spec: missing"), std::string::npos);
  auto c = Parse(
      "kind: TrainingJob\nmetadata: {name: 7}\nspec:\n  model: {preset: tiny}\n"
      "  dataset: {uri: x.jsonl}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->name, "local");
}

TEST(TrainConfigTest, OutOfRangeNumberIsNamedNotCrashed) {
  auto msg = ErrorOf(
      "model: {preset: tiny}\ndataset: {uri: x.jsonl}\noptimization: {learningRate: 1e999}\n");
  EXPECT_NE(msg.find("spec.optimization.learningRate: expected a number"), std::string::npos)
      << msg;
}

TEST(TrainConfigTest, TopLevelGarbageIsRefused) {
  EXPECT_FALSE(Parse("- just\n- a list\n").ok());
  EXPECT_NE(ErrorOf("model: {preset: tiny}\ndataset: {uri: x.jsonl}\nmodle: {}\n")
                .find("spec.modle: unknown field"),
            std::string::npos);
}

// The CRD's schema is what kubectl and the API server check a TrainingJob against: it must
// accept every LoRA target and preset the engine knows (DeepSeek's latent-attention
// projections included) and nothing the engine would refuse later.
TEST(TrainConfigTest, CrdSchemaListsExactlyTheLoraTargetsAndPresetsTheEngineKnows) {
  auto crd = ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/crds/tidal.dev_trainingjobs.yaml");
  ASSERT_TRUE(crd.ok()) << crd.status().message();
  using Pointer = nlohmann::json::json_pointer;
  const Pointer spec("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties");
  const Pointer targets_at = spec / Pointer("/lora/properties/targetModules/items/enum");
  const Pointer presets_at = spec / Pointer("/model/properties/preset/enum");
  ASSERT_TRUE(crd->contains(targets_at) && crd->contains(presets_at));
  EXPECT_EQ(crd->at(targets_at).get<std::set<std::string>>(), LoraTargetNames());
  // And every name some family can adapt is one the engine accepts.
  for (const char* preset : {"tiny", "r1-0528-qwen3-8b", "deepseek-v2-lite"})
    for (const std::string& t : PresetModelConfig(preset)->LoraTargets())
      EXPECT_TRUE(LoraTargetNames().count(t)) << preset << ": " << t;
  const auto presets = crd->at(presets_at).get<std::set<std::string>>();
  const auto names = PresetNames();
  EXPECT_EQ(presets, std::set<std::string>(names.begin(), names.end()));
}

}  // namespace
}  // namespace tidal::engine
