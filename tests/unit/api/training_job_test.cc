// The operator's view of a TrainingJob spec: defaults as the CRD gives them, the CRD's CEL
// rules and the checks beyond them (time zone, cron, URIs, Secret names), each violation named
// by its field path and all of them reported together; and the cron expressions themselves.
#include "api/training_job.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <sstream>

#include "common/yaml_json.h"

namespace tidal::api {
namespace {

using nlohmann::json;

json Example() {
  auto job = ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/examples/training-job.yaml");
  EXPECT_TRUE(job.ok()) << job.status().message();
  return (*job)["spec"];
}

TEST(TrainingJobSpecTest, TheExampleParsesWithItsWindowAndDefaults) {
  auto spec = ParseTrainingJobSpec(Example());
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->elastic.min_gpus, 2);
  EXPECT_EQ(spec->elastic.max_gpus, 4);
  EXPECT_EQ(spec->elastic.time_zone, "Asia/Shanghai");
  ASSERT_EQ(spec->elastic.schedule.size(), 1u);
  EXPECT_TRUE(spec->elastic.schedule[0].start_cron.Matches(0, 22, 5, 3, 2));
  EXPECT_FALSE(spec->elastic.schedule[0].start_cron.Matches(1, 22, 5, 3, 2));
  EXPECT_EQ(spec->elastic.cooldown_seconds, 300);
  EXPECT_EQ(spec->checkpoint.full_every_steps, 50);
  EXPECT_EQ(spec->checkpoint.keep, 3);
  EXPECT_EQ(spec->restart_policy.max_restarts, 10);
  EXPECT_FALSE(spec->anomaly.has_value());
  EXPECT_FALSE(spec->replicas.has_value());
  EXPECT_EQ(spec->AllowedGpuCounts(), (std::vector<int64_t>{2, 4}));  // 3 does not split 8 by 2
}

// Each kind of bad spec, alone, is refused with a message naming its field.
TEST(TrainingJobSpecTest, GradientCompressionGroupsSetLimitTheGpuCountsAndUnsetLimitNone) {
  json spec = Example();  // minGPUs 2, maxGPUs 4, globalBatchSize 8 by micro 2: 2 and 4 GPUs
  spec["optimization"]["zeroStage"] = 2;
  spec["optimization"]["gradientCompression"] = {{"method", "topk"}};
  auto unset = ParseTrainingJobSpec(spec);  // one group per rank, whatever the count
  ASSERT_TRUE(unset.ok()) << unset.status().message();
  EXPECT_EQ(unset->train.optimization.gradient_compression.groups, 0);
  EXPECT_EQ(unset->AllowedGpuCounts(), (std::vector<int64_t>{2, 4}));
  // 4 groups: both counts hold whole groups; the planner offers only counts that divide them.
  spec["optimization"]["gradientCompression"]["groups"] = 4;
  spec["elastic"]["minGPUs"] = 1;
  auto set = ParseTrainingJobSpec(spec);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->AllowedGpuCounts(), (std::vector<int64_t>{1, 2, 4}));
}

TEST(TrainingJobSpecTest, GradientCompressionGroupsThatAGpuCountDoesNotDivideAreRefused) {
  json spec = Example();
  spec["optimization"]["zeroStage"] = 1;
  spec["optimization"]["gradientCompression"] = {{"method", "topk"}, {"groups", 2}};
  auto parsed = ParseTrainingJobSpec(spec);  // maxGPUs 4 cannot hold 2 groups
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find(
                "spec.elastic.maxGPUs: 4 does not divide spec.optimization.gradientCompression."
                "groups (2)"),
            std::string::npos)
      << parsed.status().message();
  // More groups than micro-batches: 8 / 2 = 4 micro-batches a step.
  spec["optimization"]["gradientCompression"]["groups"] = 8;
  parsed = ParseTrainingJobSpec(spec);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("spec.optimization.gradientCompression.groups: 8 does "
                                           "not divide globalBatchSize / microBatchSize = 4"),
            std::string::npos)
      << parsed.status().message();
}

TEST(TrainingJobSpecTest, EachKindOfInvalidSpecIsRefusedNamingTheField) {
  struct Case {
    const char* pointer;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"/elastic/minGPUs", 8, "spec.elastic: minGPUs (8) must not exceed maxGPUs (4)"},
      {"/elastic/gpusPerPod", 4, "spec.elastic.minGPUs: 2 is not a multiple of gpusPerPod (4)"},
      {"/optimization/globalBatchSize", 12,
       "spec.optimization.globalBatchSize: 12 is not divisible by microBatchSize × maxGPUs = 8"},
      {"/elastic/schedule/0/gpus", 3,
       "spec.elastic.schedule[0].gpus: at 3 GPUs globalBatchSize 8 does not split"},
      {"/elastic/schedule/0/gpus", 6, "spec.elastic.schedule[0].gpus: 6 GPUs is outside"},
      {"/elastic/timeZone", "Mars/Olympus", "spec.elastic.timeZone: unknown IANA time zone"},
      {"/elastic/schedule/0/start", "0 25 * * *",
       "spec.elastic.schedule[0].start: cron \"0 25 * * *\": hour \"25\": expected 0-23"},
      {"/elastic/schedule/0/end", "0 8 * *",
       "spec.elastic.schedule[0].end: cron \"0 8 * *\": expected 5 fields"},
      {"/elastic/schedule/0/name", "Night", "spec.elastic.schedule[0].name: expected a lowercase"},
      {"/elastic/weight", 0, "spec.elastic.weight: must be in [1, 1000], got 0"},
      {"/elastic/priority", -2000000000,
       "spec.elastic.priority: must be in [-1000000000, 1000000000], got -2000000000"},
      {"/elastic/priority", "high", "spec.elastic.priority: expected"},
      {"/elastic/priorityClassName", "High_Prio",
       "spec.elastic.priorityClassName: expected a PriorityClass name (a lowercase DNS "
       "subdomain), got \"High_Prio\""},
      {"/checkpoint/uri", "ftp://host/ckpt", "spec.checkpoint.uri: expected file:///absolute/dir"},
      {"/checkpoint/uri", "s3://A_Bucket/x", "spec.checkpoint.uri: bucket \"A_Bucket\""},
      {"/checkpoint/credentialsSecret", "Bad_Secret", "spec.checkpoint.credentialsSecret"},
      {"/checkpoint/resumeFrom", "ftp://host/ckpt",
       "spec.checkpoint.resumeFrom: expected file:///absolute/dir"},
      {"/checkpoint/fullEverySteps", "often",
       "spec.checkpoint.fullEverySteps: expected an integer or \"auto\", got \"often\""},
      {"/checkpoint/fullEverySteps", 1.5, "spec.checkpoint.fullEverySteps: expected an integer"},
      {"/checkpoint/expectedMTBF", "1d",
       "spec.checkpoint.expectedMTBF: \"1d\": unit \"d\": expected h, m or s"},
      {"/checkpoint/expectedMTBF", 3600, "spec.checkpoint.expectedMTBF: expected a string"},
      {"/checkpoint/minFullEverySteps", 0,
       "spec.checkpoint.minFullEverySteps: must be in [1, 1000000000], got 0"},
      {"/checkpoint/minFullEverySteps", 20000,
       "spec.checkpoint.minFullEverySteps: must not exceed maxFullEverySteps (10000), got 20000"},
      {"/replicas", 3, "spec.replicas: at 3 GPUs"},
      {"/optimization/globalBatchSize", 1 << 20,
       "spec.optimization.globalBatchSize: 1048576 sequences per step are"},
      {"/anomaly", json{{"action", "Panic"}}, "spec.anomaly.action: expected one of Pause | Alert"},
      {"/anomaly", json{{"acknowledgedStep", -1}},
       "spec.anomaly.acknowledgedStep: must be in [0, 1000000000], got -1"},
      {"/anomaly", json{{"acknowledgedStep", "latest"}}, "spec.anomaly.acknowledgedStep: expected"},
      {"/anomaly", json{{"consecutiveSteps", 0}},
       "spec.anomaly.consecutiveSteps: must be in [1, 63], got 0"},
      {"/restartPolicy/maxRestarts", -1,
       "spec.restartPolicy.maxRestarts: must be in [0, 100000], got -1"},
      {"/worker/imagePullPolicy", "Sometimes", "spec.worker.imagePullPolicy: expected one of"},
      {"/worker/placement", "Spread", "spec.worker.placement: expected one of Pack | None"},
      {"/worker/placement", true, "spec.worker.placement: expected"},
      {"/worker/tlsSecretName", "Worker_TLS", "spec.worker.tlsSecretName: \"Worker_TLS\" is not"},
      {"/optimization/zeroStage", 5, "spec.optimization.zeroStage: must be 0, 1, 2 or 3"},
      {"/lora/targetModules", json({"qkv"}), "spec.lora.targetModules[0]: unknown module"},
      {"/elastic/minGPUz", 2, "spec.elastic.minGPUz: unknown field"},
      {"/priority", 2, "spec.priority: unknown field"},
  };
  for (const Case& c : cases) {
    json spec = Example();
    spec[json::json_pointer(c.pointer)] = c.value;
    auto parsed = ParseTrainingJobSpec(spec);
    ASSERT_FALSE(parsed.ok()) << c.pointer;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.expect), std::string::npos)
        << c.pointer << " → " << parsed.status().message();
  }
}

// A job's priority comes from spec.elastic.priority or a PriorityClass's value, never both.
TEST(TrainingJobSpecTest, APriorityAndAPriorityClassTogetherAreRefusedNamingTheField) {
  json spec = Example();
  spec["elastic"]["priorityClassName"] = "research-low";
  auto parsed = ParseTrainingJobSpec(spec);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->elastic.priority_class_name, "research-low");
  EXPECT_EQ(parsed->elastic.weight, 1);
  spec["elastic"]["priority"] = 100;
  parsed = ParseTrainingJobSpec(spec);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("spec.elastic.priorityClassName: set priority or "
                                           "priorityClassName, not both (priority 100)"),
            std::string::npos)
      << parsed.status().message();
}

// Issue 47: the operator goes on managing a job whose only fault is a `kubectl scale` to a count it
// cannot run at; with another fault, the spec is refused whole, replicas' fault included.
TEST(TrainingJobSpecTest, AManagedJobsBadReplicasAloneIsLeftOutWithWhyAndOtherFaultsStillRefuse) {
  json spec = Example();
  spec["replicas"] = 3;
  std::string refused;
  auto managed = ParseManagedJobSpec(spec, &refused);
  ASSERT_TRUE(managed.ok()) << managed.status().message();
  EXPECT_FALSE(managed->replicas.has_value());
  EXPECT_NE(refused.find("spec.replicas: at 3 GPUs"), std::string::npos) << refused;
  EXPECT_FALSE(ParseTrainingJobSpec(spec).ok()) << "the plain parse stays strict";

  spec["optimization"]["zeroStage"] = 5;
  auto both = ParseManagedJobSpec(spec, &refused);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(refused, "");
  EXPECT_NE(both.status().message().find("spec.replicas: at 3 GPUs"), std::string::npos);
  EXPECT_NE(both.status().message().find("spec.optimization.zeroStage"), std::string::npos);

  json fine = Example();
  fine["replicas"] = fine["elastic"]["minGPUs"];
  auto kept = ParseManagedJobSpec(fine, &refused);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->replicas.has_value());
  EXPECT_EQ(refused, "");
}

// Issue 47: a new job starts from another's checkpoints only when its spec names them.
TEST(TrainingJobSpecTest, ResumeFromNamesAnotherStoreNotTheJobsOwn) {
  json spec = Example();
  spec["checkpoint"]["uri"] = "s3://ckpt/a";
  spec["checkpoint"]["resumeFrom"] = "s3://ckpt/a";
  EXPECT_NE(ParseTrainingJobSpec(spec).status().message().find(
                "spec.checkpoint.resumeFrom: is spec.checkpoint.uri itself"),
            std::string::npos);
  spec["checkpoint"]["resumeFrom"] = "s3://ckpt/b";
  auto parsed = ParseTrainingJobSpec(spec);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->checkpoint.resume_from, "s3://ckpt/b");
  EXPECT_EQ(ParseTrainingJobSpec(Example())->checkpoint.resume_from, "") << "fresh by default";
}

TEST(TrainingJobSpecTest, FullEveryStepsAutoReadsItsPriorAndBoundsAndANumberStaysFixed) {
  json spec = Example();
  spec["checkpoint"]["fullEverySteps"] = "auto";
  spec["checkpoint"]["expectedMTBF"] = "6h30m";
  spec["checkpoint"]["minFullEverySteps"] = 5;
  spec["checkpoint"]["maxFullEverySteps"] = 400;
  auto parsed = ParseTrainingJobSpec(spec);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->checkpoint.full_every_auto);
  EXPECT_EQ(parsed->checkpoint.full_every_steps, 0);
  EXPECT_DOUBLE_EQ(parsed->checkpoint.auto_interval.expected_mtbf_seconds, 6.5 * 3600);
  EXPECT_EQ(parsed->checkpoint.auto_interval.min_steps, 5);
  EXPECT_EQ(parsed->checkpoint.auto_interval.max_steps, 400);

  auto fixed = ParseTrainingJobSpec(Example());
  ASSERT_TRUE(fixed.ok());
  EXPECT_FALSE(fixed->checkpoint.full_every_auto);
  EXPECT_EQ(fixed->checkpoint.full_every_steps, 50);
  EXPECT_DOUBLE_EQ(fixed->checkpoint.auto_interval.expected_mtbf_seconds, 86400);
  EXPECT_EQ(fixed->checkpoint.auto_interval.min_steps, 10);
  EXPECT_EQ(fixed->checkpoint.auto_interval.max_steps, 10000);
}

// One violation per line, each starting with its field, whatever the keys and values: a key
// that is not plain ASCII is quoted, a line break inside a violation is written \n. (Found by
// fuzz/training_job_spec_fuzz.cc: a key, then a value, with a newline split its line.)
TEST(TrainingJobSpecTest, UnknownKeysWithOddCharactersAreQuotedOnTheirOwnLine) {
  json spec = Example();
  spec["optimization"]["lr\nrate"] = 1;
  spec["elastic"][""] = 2;
  spec["lora"]["r\u00e4nk"] = 3;
  // A value with a line break in it, quoted by its refusal, stays on its line too.
  spec["worker"]["imagePullPolicy"] = "Never\nAlways";
  auto parsed = ParseTrainingJobSpec(spec);
  ASSERT_FALSE(parsed.ok());
  const std::string message = parsed.status().message();
  EXPECT_NE(message.find("spec.optimization[\"lr\\nrate\"]: unknown field"), std::string::npos)
      << message;
  EXPECT_NE(message.find("spec.elastic[\"\"]: unknown field"), std::string::npos) << message;
  EXPECT_NE(message.find("spec.lora[\"r\\u00e4nk\"]: unknown field"), std::string::npos) << message;
  EXPECT_NE(message.find("got \"Never\\nAlways\""), std::string::npos) << message;
  std::istringstream lines(message);
  std::string line;
  while (std::getline(lines, line)) EXPECT_EQ(line.rfind("spec", 0), 0u) << line;
}

TEST(TrainingJobSpecTest, EveryViolationIsReportedTogether) {
  json spec = Example();
  spec["elastic"]["timeZone"] = "Nowhere/City";
  spec["checkpoint"]["keep"] = 0;
  spec["lora"]["rank"] = 0;
  auto parsed = ParseTrainingJobSpec(spec);
  ASSERT_FALSE(parsed.ok());
  const std::string& m = parsed.status().message();
  EXPECT_NE(m.find("spec.elastic.timeZone"), std::string::npos) << m;
  EXPECT_NE(m.find("spec.checkpoint.keep"), std::string::npos) << m;
  EXPECT_NE(m.find("spec.lora.rank"), std::string::npos) << m;
}

TEST(CronTest, FieldsListsRangesStepsAndNames) {
  auto c = ParseCron("*/15 9-17 * jan,JUL mon-fri");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->Matches(45, 9, 14, 1, 1));
  EXPECT_FALSE(c->Matches(50, 9, 14, 1, 1));                    // minute
  EXPECT_FALSE(c->Matches(0, 18, 14, 1, 1));                    // hour
  EXPECT_FALSE(c->Matches(0, 9, 14, 2, 1));                     // month
  EXPECT_FALSE(c->Matches(0, 9, 14, 7, 0));                     // Sunday
  EXPECT_TRUE(ParseCron("0 0 * * 7")->Matches(0, 0, 1, 1, 0));  // 7 is Sunday
  EXPECT_TRUE(ParseCron("5/20 * * * *")->Matches(45, 3, 1, 1, 3));
  EXPECT_FALSE(ParseCron("5/20 * * * *")->Matches(0, 3, 1, 1, 3));
  // Both day fields restricted: either matches (Vixie cron).
  auto either = ParseCron("0 0 1 * mon");
  EXPECT_TRUE(either->Matches(0, 0, 1, 6, 4));
  EXPECT_TRUE(either->Matches(0, 0, 9, 6, 1));
  EXPECT_FALSE(either->Matches(0, 0, 9, 6, 2));
}

TEST(CronTest, BadExpressionsNameTheField) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"60 * * * *", "minute \"60\": expected 0-59"},
      {"* * 0 * *", "day \"0\": expected 1-31"},
      {"* * * 13 *", "month \"13\": expected 1-12 or a name"},
      {"* * * * funday", "weekday \"funday\": expected 0-7 or a name"},
      {"*/0 * * * *", "minute \"*/0\": expected a positive step"},
      {"5-1 * * * *", "minute \"5-1\": range runs backwards"},
      {"* * * *", "expected 5 fields"},
      {"@daily", "expected 5 fields"},
  };
  for (const auto& [text, expect] : cases) {
    auto parsed = ParseCron(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find(expect), std::string::npos)
        << text << " → " << parsed.status().message();
  }
}

}  // namespace
}  // namespace tidal::api
