// ShareIndex (operator/controller/share_index.h): the shares' inputs as the informers deliver
// them — TrainingJobs as stored, nodes, pods of other workloads, PriorityClasses — and the
// jobs it wakes when their share changes. No API server: the objects are handed in as the
// informers' handlers hand them.
#include "operator/controller/share_index.h"

#include <gtest/gtest.h>

#include <set>

namespace tidal::controller {
namespace {

using nlohmann::json;

json Job(const std::string& name, int64_t current, const json& elastic = json::object(),
         const json& conditions = json::array(), int created_second = 0) {
  json spec = {{"model", {{"preset", "tiny"}}},
               {"dataset", {{"uri", "/data/sample.jsonl"}, {"format", "text"}, {"maxSeqLen", 32}}},
               // A global batch of 24 splits at 2, 3, 4, 6 and 8 GPUs.
               {"optimization", {{"globalBatchSize", 24}, {"microBatchSize", 1}, {"maxSteps", 10}}},
               {"elastic", {{"minGPUs", 2}, {"maxGPUs", 8}}}};
  spec["elastic"].merge_patch(elastic);
  spec["replicas"] = 8;  // wants all 8
  return {{"metadata",
           {{"name", name},
            {"namespace", "ml"},
            {"generation", 1},
            {"creationTimestamp", "2026-12-07T10:00:0" + std::to_string(created_second) + "Z"}}},
          {"spec", spec},
          {"status",
           {{"phase", current > 0 ? "Running" : "Pending"},
            {"gpus", {{"current", current}}},
            {"conditions", conditions}}}};
}

json Node(int64_t gpus, bool ready = true) {
  return {
      {"metadata", {{"name", "gpu-1"}}},
      {"status",
       {{"allocatable", {{"nvidia.com/gpu", std::to_string(gpus)}}},
        {"conditions", json::array({{{"type", "Ready"}, {"status", ready ? "True" : "False"}}})}}}};
}

struct Fixture {
  std::set<std::string> woken;
  ShareIndex index{
      [this](const std::string& job) { woken.insert(job); }, std::nullopt,
      [] { return std::chrono::system_clock::time_point(std::chrono::hours(500000)); }};
};

TEST(ShareIndex, JobsShareTheNodesGpusAndAJobWhoseShareChangesIsWoken) {
  Fixture f;
  const json node = Node(8);
  f.index.SetNode("gpu-1", &node);
  const json a = Job("a", 8);
  f.index.SetJob("ml/a", &a);
  ASSERT_TRUE(f.index.Get("ml/a"));
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 8);
  f.woken.clear();
  const json b = Job("b", 0, json::object(), json::array(), 1);
  f.index.SetJob("ml/b", &b);
  EXPECT_TRUE(f.woken.count("ml/a")) << "a's share fell from 8 to 4: it must shrink";
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 4);
  EXPECT_TRUE(f.index.Get("ml/a")->urgent);
  EXPECT_EQ(f.index.Get("ml/b")->gpus, 4);
  // b goes: a gets all 8 back.
  f.woken.clear();
  f.index.SetJob("ml/b", nullptr);
  EXPECT_TRUE(f.woken.count("ml/a"));
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 8);
  EXPECT_FALSE(f.index.Get("ml/b"));
}

// The regression CI found (stop 62): four jobs whose specs the data phase refused, each still
// Pending, held their minima, and a fifth valid job waited forever for GPUs nobody used.
TEST(ShareIndex, AJobThatCannotRunUntilItsSpecIsEditedHoldsNoShare) {
  Fixture f;
  const json node = Node(4);
  f.index.SetNode("gpu-1", &node);
  const json refused = json::array({{{"type", "Ready"},
                                     {"status", "False"},
                                     {"reason", "InvalidSpec"},
                                     {"message", "spec.dataset.uri: no such file"}}});
  const json bad1 = Job("bad1", 0, json::object(), refused, 0);
  const json bad2 = Job("bad2", 0, json::object(), refused, 1);
  const json good = Job("good", 0, json::object(), json::array(), 2);
  f.index.SetJob("ml/bad1", &bad1);
  f.index.SetJob("ml/bad2", &bad2);
  f.index.SetJob("ml/good", &good);
  EXPECT_FALSE(f.index.Get("ml/bad1"));
  ASSERT_TRUE(f.index.Get("ml/good"));
  EXPECT_TRUE(f.index.Get("ml/good")->admitted);
  EXPECT_EQ(f.index.Get("ml/good")->gpus, 4);
}

// Other workloads: a bound pod's GPUs are no one's to share; a Pending pod of a higher priority
// (a PriorityClass's value, as the API server set it) is served from the job's headroom, and a
// job naming a PriorityClass ranks at its value.
TEST(ShareIndex, OtherWorkloadsPodsAndPriorityClassesMoveTheShares) {
  Fixture f;
  const json node = Node(8);
  f.index.SetNode("gpu-1", &node);
  const json a = Job("a", 8, {{"priorityClassName", "research"}});
  f.index.SetJob("ml/a", &a);
  kube::CachedPod bound;
  bound.gpu_request = 2;
  bound.node_name = "gpu-1";
  bound.phase = kube::PodPhase::kRunning;
  f.index.SetOtherPod("web/hog", &bound);
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 6);
  kube::CachedPod waiting;
  waiting.gpu_request = 2;
  waiting.priority = 100;
  f.index.SetOtherPod("serving/llm-0", &waiting);
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 4) << "priority 100 above the job's 0";
  f.woken.clear();
  f.index.SetPriorityClass("research", 1000);
  EXPECT_TRUE(f.woken.count("ml/a"));
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 6) << "at 1000 the job outranks the pod";
  f.index.SetOtherPod("web/hog", nullptr);
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 8);
  const json down = Node(8, /*ready=*/false);
  f.index.SetNode("gpu-1", &down);
  EXPECT_EQ(f.index.Get("ml/a")->gpus, 2)
      << "a lost node shares nothing; the job keeps its minimum";
}

}  // namespace
}  // namespace tidal::controller
