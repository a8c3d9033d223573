// crds/tidal.dev_trainingjobs.yaml is the TrainingJob's source of truth: its shape (names,
// subresources, printer columns), and the defaults it gives a spec, which must be the ones the
// C++ code assumes when a field is absent — checked by defaulting a minimal spec with the CRD's
// schema (as the API server does) and parsing it both ways.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "api/spec_limits.h"
#include "api/train_config.h"
#include "api/training_job.h"
#include "common/yaml_json.h"
#include "local/schema.h"
#include "tests/test_paths.h"

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
  EXPECT_EQ(columns, (std::vector<std::string>{"Phase", "GPUs", "Step", "Loss", "Last-Ckpt", "Age",
                                               "Reason", "GPU-Reason"}));
  // Issue 47: an InvalidSpec job showed only "Pending 0/0"; -o wide names the reason.
  EXPECT_EQ(v["additionalPrinterColumns"][6]["priority"], 1);
  EXPECT_EQ(v["additionalPrinterColumns"][6]["jsonPath"],
            ".status.conditions[?(@.type==\"Ready\")].reason");
  // Issue 50: why a job has the GPUs it has (its share, a wait) is a wide column too.
  EXPECT_EQ(v["additionalPrinterColumns"][7]["priority"], 1);
  EXPECT_EQ(v["additionalPrinterColumns"][7]["jsonPath"], ".status.gpus.reason");
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

// Every top-level spec field the CRD declares is one the engine's parser (tidal-train, tidal-prep)
// accepts, set or not: a job applied with spec.replicas once failed its data phase with
// "spec.replicas: unknown field".
TEST(CrdTest, EverySpecFieldTheCrdDeclaresIsAcceptedByTheEnginesParser) {
  const json crd = Crd();
  const json& properties =
      Version(crd)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
  json job = {{"apiVersion", "tidal.dev/v1alpha1"},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", "t"}}},
              {"spec", {{"model", {{"preset", "tiny"}}}, {"dataset", {{"uri", "d.jsonl"}}}}}};
  ASSERT_TRUE(local::ApplySchema(Version(crd)["schema"]["openAPIV3Schema"], job).errors.empty());
  for (const auto& [key, property] : properties.items()) {
    if (job["spec"].contains(key)) continue;
    const std::string type = property.value("type", "");
    job["spec"][key] = type == "integer"   ? json(2)
                       : type == "boolean" ? json(false)
                       : type == "string"  ? json("x")
                                           : json::object();
  }
  EXPECT_TRUE(job["spec"].contains("replicas"));
  auto parsed = engine::TrainConfigFromJson(job, "/data");
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
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
      // int-or-string: the pattern checks a string, the bounds an integer.
      {"/spec/checkpoint/fullEverySteps", "often", "spec.checkpoint.fullEverySteps"},
      {"/spec/checkpoint/fullEverySteps", 1000000001, "spec.checkpoint.fullEverySteps"},
      {"/spec/checkpoint/fullEverySteps", -1, "spec.checkpoint.fullEverySteps"},
      {"/spec/checkpoint/fullEverySteps", 2.5, "spec.checkpoint.fullEverySteps"},
      {"/spec/checkpoint/expectedMTBF", "a day", "spec.checkpoint.expectedMTBF"},
      {"/spec/checkpoint/minFullEverySteps", 0, "spec.checkpoint.minFullEverySteps"},
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

// fullEverySteps takes "auto" or an integer, and the CRD's defaults of the automatic interval's
// prior and bounds are the C++ ones.
TEST(CrdTest, FullEveryStepsAutoIsAcceptedAndTheIntervalsDefaultsAreTheOperators) {
  const json crd = Crd();
  const json& schema = Version(crd)["schema"]["openAPIV3Schema"];
  for (const json& every : {json("auto"), json(0), json(1000000000)}) {
    json job = {{"apiVersion", "tidal.dev/v1alpha1"},
                {"kind", "TrainingJob"},
                {"metadata", {{"name", "t"}}},
                {"spec",
                 {{"model", {{"preset", "tiny"}}},
                  {"dataset", {{"uri", "/d.jsonl"}}},
                  {"checkpoint", {{"fullEverySteps", every}}}}}};
    local::SchemaResult result = local::ApplySchema(schema, job);
    ASSERT_TRUE(result.errors.empty()) << every << ": " << result.errors[0].message;
    auto from_crd = api::ParseTrainingJobSpec(job["spec"]);
    ASSERT_TRUE(from_crd.ok()) << from_crd.status().message();
    EXPECT_EQ(from_crd->checkpoint.full_every_auto, every == "auto");
    const api::CheckpointSpec defaults;
    EXPECT_EQ(job["spec"]["checkpoint"]["expectedMTBF"], "24h");
    EXPECT_DOUBLE_EQ(from_crd->checkpoint.auto_interval.expected_mtbf_seconds,
                     defaults.auto_interval.expected_mtbf_seconds);
    EXPECT_EQ(from_crd->checkpoint.auto_interval.min_steps, defaults.auto_interval.min_steps);
    EXPECT_EQ(from_crd->checkpoint.auto_interval.max_steps, defaults.auto_interval.max_steps);
  }
}

// Every integer of the spec the user sets: the schema bounds it (seeds excepted: any uint64),
// one past its maximum is refused by the schema and — for a CRD installed before the bound
// existed — by the operator's own parsing, both naming the field; the maximum itself is not
// refused for its range. The bounds are api/spec_limits.h's.
TEST(CrdTest, EveryIntegerFieldHasAMaximumRefusedOnePastItByTheSchemaAndTheOperator) {
  const json crd = Crd();
  const json& schema = Version(crd)["schema"]["openAPIV3Schema"];
  struct Field {
    std::string pointer, path;
    int64_t maximum;
  };
  std::vector<Field> fields;
  std::vector<std::string> unbounded;
  std::function<void(const json&, const std::string&, const std::string&)> walk =
      [&](const json& node, const std::string& pointer, const std::string& path) {
        // int-or-string fields (microBatchSize, fullEverySteps: a number or "auto") too.
        if (node.value("type", "") == "integer" ||
            node.value("x-kubernetes-int-or-string", false)) {
          if (node.contains("maximum"))
            fields.push_back({pointer, path, node["maximum"].get<int64_t>()});
          else if (!path.ends_with(".seed"))
            unbounded.push_back(path);
        }
        if (node.contains("properties"))
          for (const auto& [key, child] : node["properties"].items())
            walk(child, pointer + "/" + key, path + "." + key);
        if (node.contains("items")) walk(node["items"], pointer + "/0", path + "[0]");
      };
  walk(schema["properties"]["spec"], "/spec", "spec");
  EXPECT_TRUE(unbounded.empty()) << "integer fields without a maximum: " << unbounded.front();
  ASSERT_GE(fields.size(), 20u);

  // Each bound is the one the C++ code enforces.
  const std::map<std::string, int64_t> expected = {
      {"spec.replicas", spec::kMaxGpus},
      {"spec.elastic.minGPUs", spec::kMaxGpus},
      {"spec.elastic.maxGPUs", spec::kMaxGpus},
      {"spec.elastic.schedule[0].gpus", spec::kMaxGpus},
      {"spec.elastic.gpusPerPod", spec::kMaxGpusPerPod},
      {"spec.optimization.globalBatchSize", spec::kMaxGlobalBatchSize},
      {"spec.optimization.microBatchSize", spec::kMaxMicroBatchSize},
      {"spec.dataset.maxSeqLen", spec::kMaxSeqLen},
      {"spec.lora.rank", spec::kMaxLoraRank},
      {"spec.optimization.maxSteps", spec::kMaxSteps},
      {"spec.optimization.warmup.window", spec::kMaxWarmupWindow},
      {"spec.elastic.cooldownSeconds", spec::kMaxSeconds},
      {"spec.elastic.priority", spec::kMaxPriority},
      {"spec.elastic.weight", spec::kMaxWeight},
      {"spec.restartPolicy.backoffSeconds", spec::kMaxSeconds},
      {"spec.restartPolicy.maxRestarts", spec::kMaxRestarts},
      {"spec.checkpoint.keep", spec::kMaxKeep},
      {"spec.anomaly.consecutiveSteps", spec::kMaxAnomalySteps},
  };
  for (const auto& [path, max] : expected) {
    // Named capture: clang 14 (tools/sanitize.sh) cannot capture a structured binding.
    auto it = std::find_if(fields.begin(), fields.end(),
                           [&path = path](const Field& f) { return f.path == path; });
    ASSERT_NE(it, fields.end()) << path;
    EXPECT_EQ(it->maximum, max) << path;
  }

  const json base = {
      {"model", {{"preset", "tiny"}}},
      {"dataset", {{"uri", "/d.jsonl"}}},
      {"elastic",
       {{"schedule",
         json::array(
             {{{"name", "night"}, {"start", "0 22 * * *"}, {"end", "0 8 * * *"}, {"gpus", 1}}})}}},
      {"anomaly", json::object()}};
  for (const Field& f : fields) {
    SCOPED_TRACE(f.path);
    const json::json_pointer at(f.pointer.substr(std::string("/spec").size()));
    for (int64_t value : {f.maximum + 1, f.maximum}) {
      json job = {{"apiVersion", "tidal.dev/v1alpha1"},
                  {"kind", "TrainingJob"},
                  {"metadata", {{"name", "t"}}},
                  {"spec", base}};
      job["spec"][at] = value;
      json stored = job["spec"];
      local::SchemaResult result = local::ApplySchema(schema, job);
      auto parsed = api::ParseTrainingJobSpec(stored);
      const std::string range_error = f.path + ": must be in [";
      const std::string message = parsed.ok() ? "" : parsed.status().message();
      if (value > f.maximum) {
        ASSERT_FALSE(result.errors.empty());
        EXPECT_EQ(result.errors[0].field, f.path);
        EXPECT_NE(message.find(f.path + ": "), std::string::npos) << message;
      } else {
        for (const auto& e : result.errors) EXPECT_NE(e.field, f.path) << e.message;
        EXPECT_EQ(message.find(range_error), std::string::npos) << message;
      }
    }
  }
}

// The poison spec of issue 20: maxGPUs 2^62 once overflowed microBatchSize × maxGPUs to 0 and
// divided by it (SIGFPE in the operator). The operator refuses it naming the field, and the
// allowed GPU counts of the largest valid spec come from the divisors, not from a walk.
TEST(CrdTest, AHugeMaxGpusIsRefusedWithoutArithmeticOverflow) {
  const json poison = {
      {"model", {{"preset", "tiny"}}},
      {"dataset", {{"uri", "/d.jsonl"}, {"maxSeqLen", 32}}},
      {"optimization",
       {{"precision", "fp32"}, {"globalBatchSize", 12}, {"microBatchSize", 4}, {"maxSteps", 50}}},
      {"elastic", {{"minGPUs", 1}, {"maxGPUs", int64_t{1} << 62}}}};
  auto parsed = api::ParseTrainingJobSpec(poison);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("spec.elastic.maxGPUs: must be in [1, 65536], got "
                                           "4611686018427387904"),
            std::string::npos)
      << parsed.status().message();
  json huge = poison;
  huge["elastic"]["maxGPUs"] = uint64_t{1} << 63;  // past int64: still named, not wrapped
  parsed = api::ParseTrainingJobSpec(huge);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("spec.elastic.maxGPUs: expected an integer below 2^63"),
            std::string::npos)
      << parsed.status().message();

  json largest = poison;
  largest["optimization"]["globalBatchSize"] = spec::kMaxGlobalBatchSize;
  largest["optimization"]["microBatchSize"] = 1;
  largest["elastic"]["maxGPUs"] = spec::kMaxGpus;
  parsed = api::ParseTrainingJobSpec(largest);
  // Issue 47: at minGPUs 1 a step is 2^24 micro-batches, which held every barrier for hours.
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("16777216 micro-batches of 1 per rank at minGPUs 1, "
                                           "more than 4096"),
            std::string::npos)
      << parsed.status().message();
  largest["elastic"]["minGPUs"] = (spec::kMaxGlobalBatchSize / spec::kMaxMicroBatchesPerStep);
  parsed = api::ParseTrainingJobSpec(largest);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  std::vector<int64_t> powers;  // 2^24's divisors from 2^12 up to 2^16
  for (int64_t n = 4096; n <= spec::kMaxGpus; n *= 2) powers.push_back(n);
  EXPECT_EQ(parsed->AllowedGpuCounts(), powers);
}

}  // namespace
}  // namespace tidal
