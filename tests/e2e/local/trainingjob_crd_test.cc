// The TrainingJob CRD (crds/) through the real kubectl on `tidal local`: it installs, a job
// gets the schema's defaults and the printer columns, `kubectl scale` sets the manual GPU
// count, and a spec the schema refuses is refused naming the field, creating nothing.
#include <gtest/gtest.h>

#include <regex>

#include "tests/e2e/local/kubectl_fixture.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

const std::string kCrd = std::string(TIDAL_SOURCE_DIR) + "/crds/tidal.dev_trainingjobs.yaml";
const std::string kJob = std::string(TIDAL_SOURCE_DIR) + "/examples/training-job.yaml";

TEST_F(KubectlTest, TrainingJobCrdInstallsAndJobsGetDefaultsColumnsAndScale) {
  EXPECT_EQ(Ok({"apply", "-f", kCrd}),
            "customresourcedefinition.apiextensions.k8s.io/trainingjobs.tidal.dev created\n");
  EXPECT_EQ(Ok({"apply", "-f", kJob}), "trainingjob.tidal.dev/tiny-lora created\n");
  std::string table = Ok({"get", "tj"});
  EXPECT_TRUE(std::regex_search(table, std::regex("NAME +PHASE +GPUS +STEP +LOSS +LAST-CKPT +AGE")))
      << table;
  const std::string wide = Ok({"get", "tj", "-o", "wide"});
  EXPECT_TRUE(std::regex_search(wide, std::regex("LAST-CKPT +AGE +REASON +GPU-REASON"))) << wide;
  EXPECT_NE(Ok({"get", "all"}).find("trainingjob.tidal.dev/tiny-lora"), std::string::npos)
      << "category all";
  EXPECT_EQ(Ok({"get", "tj", "tiny-lora", "-o", "jsonpath={.spec.elastic.cooldownSeconds}"}),
            "300");
  EXPECT_EQ(Ok({"get", "tj", "tiny-lora", "-o", "jsonpath={.spec.optimization.zeroStage}"}), "3");
  EXPECT_EQ(Ok({"get", "tj", "tiny-lora", "-o", "jsonpath={.spec.restartPolicy.maxRestarts}"}),
            "10");
  EXPECT_EQ(Ok({"scale", "tj", "tiny-lora", "--replicas=4"}),
            "trainingjob.tidal.dev/tiny-lora scaled\n");
  EXPECT_EQ(Ok({"get", "trainingjob", "tiny-lora", "-o", "jsonpath={.spec.replicas}"}), "4");
}

TEST_F(KubectlTest, TrainingJobSpecsTheSchemaRefusesNameTheFieldAndCreateNothing) {
  Ok({"apply", "-f", kCrd});
  struct Case {
    const char* spec;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"model: {preset: tiny}\n  dataset: {uri: d.jsonl}\n  optimization: {zeroStage: 7}",
       "spec.optimization.zeroStage"},
      {"model: {preset: tiny}\n  dataset: {uri: d.jsonl}\n  lora: {targetModules: [qkv]}",
       "spec.lora.targetModules[0]"},
      {"model: {preset: tiny}", "spec.dataset"},
      {"model: {preset: tiny}\n  dataset: {uri: d.jsonl}\n  elastic: {schedule: [{name: Night, "
       "start: '0 22 * * *', end: '0 8 * * *', gpus: 2}]}",
       "spec.elastic.schedule[0].name"},
  };
  for (const Case& c : cases) {
    std::string path = WriteFile("bad.yaml", std::string("apiVersion: tidal.dev/v1alpha1\n") +
                                                 "kind: TrainingJob\nmetadata: {name: bad}\n" +
                                                 "spec:\n  " + c.spec + "\n");
    ProcessResult r = Kubectl({"apply", "-f", path});
    EXPECT_NE(r.exit_code, 0) << c.spec;
    EXPECT_NE(r.err.find(c.field), std::string::npos) << r.err;
  }
  EXPECT_EQ(Ok({"get", "tj", "-o", "name"}), "");
}

}  // namespace
}  // namespace tidal::testing
