// crds/tidal.dev_trainingjobs.yaml is the TrainingJob's source of truth: its shape (names,
// subresources, printer columns), and the defaults it gives a spec, which must be the ones the
// C++ code assumes when a field is absent — checked by defaulting a minimal spec with the CRD's
// schema (as the API server does) and parsing it both ways.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/yaml_json.h"
#include "operator/local/schema.h"
#include "worker/engine/train_config.h"

namespace tidal {
namespace {

using nlohmann::json;

json Crd() {
  auto crd = ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/crds/tidal.dev_trainingjobs.yaml");
  EXPECT_TRUE(crd.ok()) << crd.status().message();
  return crd.ok() ? *crd : json::object();
}

const json& Version(const json& crd) { return crd["spec"]["versions"][0]; }

TEST(CrdTest, NamesSubresourcesAndPrinterColumnsAreTheContract) {
  json crd = Crd();
  EXPECT_EQ(crd["metadata"]["name"], "trainingjobs.tidal.dev");
  EXPECT_EQ(crd["spec"]["names"]["kind"], "TrainingJob");
  EXPECT_EQ(crd["spec"]["names"]["shortNames"], json({"tj"}));
  EXPECT_EQ(crd["spec"]["names"]["categories"], json({"all"}));
  const json& v = Version(crd);
  EXPECT_EQ(v["name"], "v1alpha1");
  EXPECT_TRUE(v["subresources"].contains("status"));
  EXPECT_EQ(v["subresources"]["scale"]["specReplicasPath"], ".spec.replicas");
  EXPECT_EQ(v["subresources"]["scale"]["statusReplicasPath"], ".status.gpus.current");
  EXPECT_EQ(v["subresources"]["scale"]["labelSelectorPath"], ".status.selector");
  std::vector<std::string> columns;
  for (const json& c : v["additionalPrinterColumns"]) columns.push_back(c["name"]);
  EXPECT_EQ(columns,
            (std::vector<std::string>{"Phase", "GPUs", "Step", "Loss", "Last-Ckpt", "Age"}));
}

// Every field with a default in the CRD's engine sections gets the same value from the C++
// parser when it is absent, and every such field is one the parser knows.
TEST(CrdTest, SchemaDefaultsAreTheEnginesDefaults) {
  const json crd = Crd();
  const json& schema = Version(crd)["schema"]["openAPIV3Schema"];
  const json minimal = {
      {"apiVersion", "tidal.dev/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", "t"}}},
      {"spec", {{"model", {{"preset", "tiny"}}}, {"dataset", {{"uri", "d.jsonl"}}}}}};
  json defaulted = minimal;
  local::SchemaResult result = local::ApplySchema(schema, defaulted);
  ASSERT_TRUE(result.errors.empty()) << result.errors[0].field << ": " << result.errors[0].message;
  // The CRD filled in what it defaults…
  EXPECT_TRUE(defaulted["spec"]["optimization"].contains("learningRate"));
  EXPECT_TRUE(defaulted["spec"]["optimization"]["warmup"].contains("cvThreshold"));
  EXPECT_TRUE(defaulted["spec"]["elastic"].contains("cooldownSeconds"));

  auto from_crd = engine::TrainConfigFromJson(defaulted, "/data");
  ASSERT_TRUE(from_crd.ok()) << from_crd.status().message();  // no field the parser lacks
  auto from_cpp = engine::TrainConfigFromJson(minimal, "/data");
  ASSERT_TRUE(from_cpp.ok()) << from_cpp.status().message();
  const engine::TrainConfig& a = *from_crd;
  const engine::TrainConfig& b = *from_cpp;
  EXPECT_EQ(a.model.init_seed, b.model.init_seed);
  EXPECT_EQ(a.dataset.format, b.dataset.format);
  EXPECT_EQ(a.dataset.max_seq_len, b.dataset.max_seq_len);
  EXPECT_EQ(a.lora.rank, b.lora.rank);
  EXPECT_EQ(a.lora.alpha, b.lora.alpha);
  EXPECT_EQ(a.lora.dropout, b.lora.dropout);
  EXPECT_EQ(a.lora.target_modules, b.lora.target_modules);
  const auto &o = a.optimization, &p = b.optimization;
  EXPECT_EQ(o.zero_stage, p.zero_stage);
  EXPECT_EQ(o.offload_optimizer, p.offload_optimizer);
  EXPECT_EQ(o.precision, p.precision);
  EXPECT_EQ(o.global_batch_size, p.global_batch_size);
  EXPECT_EQ(o.micro_batch_size, p.micro_batch_size);
  EXPECT_EQ(o.learning_rate, p.learning_rate);
  EXPECT_EQ(o.min_lr_ratio, p.min_lr_ratio);
  EXPECT_EQ(o.weight_decay, p.weight_decay);
  EXPECT_EQ(o.beta1, p.beta1);
  EXPECT_EQ(o.beta2, p.beta2);
  EXPECT_EQ(o.eps, p.eps);
  EXPECT_EQ(o.grad_clip, p.grad_clip);
  EXPECT_EQ(o.max_steps, p.max_steps);
  EXPECT_EQ(o.seed, p.seed);
  EXPECT_EQ(o.warmup.steps, p.warmup.steps);
  EXPECT_EQ(o.warmup.adaptive, p.warmup.adaptive);
  EXPECT_EQ(o.warmup.window, p.warmup.window);
  EXPECT_EQ(o.warmup.cv_threshold, p.warmup.cv_threshold);
  EXPECT_EQ(o.warmup.max_extra_steps, p.warmup.max_extra_steps);
}

// What the schema itself refuses (the API server's 422), each naming its field.
TEST(CrdTest, SchemaRefusesOutOfRangeAndUnknownValuesNamingTheField) {
  const json crd = Crd();
  const json& schema = Version(crd)["schema"]["openAPIV3Schema"];
  struct Case {
    const char* pointer;
    json value;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"/spec/optimization/zeroStage", 4, "spec.optimization.zeroStage"},
      {"/spec/optimization/precision", "fp8", "spec.optimization.precision"},
      {"/spec/lora/rank", 0, "spec.lora.rank"},
      {"/spec/lora/targetModules", json({"qkv"}), "spec.lora.targetModules[0]"},
      {"/spec/elastic/minGPUs", 0, "spec.elastic.minGPUs"},
      {"/spec/elastic/schedule",
       json({{{"name", "night"}, {"start", "0 22 * *"}, {"end", "0 8 * * *"}, {"gpus", 4}}}),
       "spec.elastic.schedule[0].start"},
      {"/spec/dataset/format", "csv", "spec.dataset.format"},
      {"/spec/model/preset", "13b", "spec.model.preset"},
  };
  for (const Case& c : cases) {
    json job = {{"apiVersion", "tidal.dev/v1alpha1"},
                {"kind", "TrainingJob"},
                {"metadata", {{"name", "t"}}},
                {"spec", {{"model", {{"preset", "tiny"}}}, {"dataset", {{"uri", "d.jsonl"}}}}}};
    job[json::json_pointer(c.pointer)] = c.value;
    local::SchemaResult result = local::ApplySchema(schema, job);
    ASSERT_FALSE(result.errors.empty()) << c.pointer;
    EXPECT_EQ(result.errors[0].field, c.field) << result.errors[0].message;
  }
}

}  // namespace
}  // namespace tidal
