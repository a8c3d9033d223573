// The event recorder against a real `tidal local`: five identical events become one core/v1
// Event with count 5, a different message a second Event, and an Event the server no longer
// has is created again with its count; checked by listing Events with the client.
#include "kube/events.h"

#include <gtest/gtest.h>

#include <regex>

#include "tests/integration/kube/local_cluster.h"

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

class EventsIntegration : public LocalClusterTest {
 protected:
  // The Events about `name` that this recorder's component posted, oldest first.
  std::vector<json> EventsAbout(const std::string& name) {
    std::vector<json> out;
    auto list = client_->Call(*ListRequest(Resource::Events(), "default", {}));
    EXPECT_TRUE(list.ok()) << list.status().ToString();
    if (!list.ok()) return out;
    for (const auto& e : (*list)["items"])
      if (e["involvedObject"].value("name", "") == name &&
          e["source"].value("component", "") == "tidal-operator")
        out.push_back(e);
    std::sort(out.begin(), out.end(), [](const json& a, const json& b) {
      return a["metadata"]["name"] < b["metadata"]["name"];  // hex nanoseconds: creation order
    });
    return out;
  }
};

TEST_F(EventsIntegration, RepeatsAreCountedOnOneEventAndADifferentMessageMakesAnother) {
  json job =
      Create(Resource::ConfigMaps(), "default",
             {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "llama-job"}}}});
  EventRecorderOptions options;
  options.source = {"tidal-operator", "operator-pod-0"};
  EventRecorder recorder(*client_, options);
  for (int i = 0; i < 5; ++i) recorder.Normal(job, "Scaled", "scaled from 4 to 8 GPUs");
  ASSERT_TRUE(recorder.Flush(30s));
  std::vector<json> events = EventsAbout("llama-job");
  ASSERT_EQ(events.size(), 1u) << json(events).dump(2);
  const json& scaled = events[0];
  EXPECT_EQ(scaled["count"], 5);
  EXPECT_EQ(scaled["type"], "Normal");
  EXPECT_EQ(scaled["reason"], "Scaled");
  EXPECT_EQ(scaled["message"], "scaled from 4 to 8 GPUs");
  EXPECT_EQ(scaled["involvedObject"]["kind"], "ConfigMap");
  EXPECT_EQ(scaled["involvedObject"]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(scaled["source"]["host"], "operator-pod-0");
  EXPECT_TRUE(std::regex_match(scaled["metadata"]["name"].get<std::string>(),
                               std::regex(R"(llama-job\.[0-9a-f]+)")))
      << scaled["metadata"]["name"];
  EXPECT_LE(scaled["firstTimestamp"].get<std::string>(),
            scaled["lastTimestamp"].get<std::string>());

  recorder.Warning(job, "Scaled", "scale-up timed out: 2 pods Pending");
  ASSERT_TRUE(recorder.Flush(30s));
  events = EventsAbout("llama-job");
  ASSERT_EQ(events.size(), 2u) << json(events).dump(2);
  EXPECT_EQ(events[0]["count"], 5);
  EXPECT_EQ(events[1]["count"], 1);
  EXPECT_EQ(events[1]["type"], "Warning");
  EXPECT_EQ(events[1]["message"], "scale-up timed out: 2 pods Pending");

  // The server loses the first Event (as its TTL would): the next repeat recreates it, whole.
  ASSERT_TRUE(
      client_->Call(*DeleteRequest(Resource::Events(), "default", events[0]["metadata"]["name"]))
          .ok());
  recorder.Normal(job, "Scaled", "scaled from 4 to 8 GPUs");
  ASSERT_TRUE(recorder.Flush(30s));
  events = EventsAbout("llama-job");
  ASSERT_EQ(events.size(), 2u) << json(events).dump(2);
  EXPECT_EQ(events[0]["count"], 6);
  EXPECT_EQ(events[0]["message"], "scaled from 4 to 8 GPUs");
  EventRecorder::Stats stats = recorder.stats();
  EXPECT_EQ(stats.created, 3u);
  EXPECT_EQ(stats.patched, 4u);
  EXPECT_EQ(stats.failed, 0u);
  EXPECT_EQ(stats.dropped, 0u);
}

TEST_F(EventsIntegration, ClusterScopedObjectsGetTheirEventsInDefault) {
  auto nodes = client_->Call(*ListRequest(Resource::Nodes(), "", {}));
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_FALSE((*nodes)["items"].empty());
  json node = (*nodes)["items"][0];
  node["apiVersion"] = "v1";
  node["kind"] = "Node";
  EventRecorderOptions options;
  options.source = {"tidal-operator", ""};
  EventRecorder recorder(*client_, options);
  recorder.Normal(node, "CapacityChanged", "8 GPUs allocatable");
  ASSERT_TRUE(recorder.Flush(30s));
  std::vector<json> events = EventsAbout(node["metadata"]["name"]);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["metadata"]["namespace"], "default");
  EXPECT_EQ(events[0]["involvedObject"]["kind"], "Node");
}

}  // namespace
}  // namespace tidal::kube
