// Object metadata: typed where Tidal needs it, and a round trip keeps every field it does not
// know, so a read-modify-write never drops what a newer API server added.
#include "kube/object.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using nlohmann::json;

const json kPod = json::parse(R"({
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {
    "name": "w-0", "namespace": "ml", "uid": "u-1", "resourceVersion": "17", "generation": 2,
    "labels": {"tidal.dev/job": "llama"}, "annotations": {"a": "b"},
    "finalizers": ["tidal.dev/checkpoint"],
    "ownerReferences": [{"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob",
                         "name": "llama", "uid": "u-0", "controller": true,
                         "blockOwnerDeletion": true}],
    "managedFields": [{"manager": "kubectl"}]
  },
  "spec": {"containers": [{"name": "worker"}]},
  "status": {"phase": "Running", "podIP": "127.0.0.5"}
})");

TEST(ObjectTest, TypedMetadataIsRead) {
  auto o = ObjectFromJson(kPod);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->kind, "Pod");
  EXPECT_EQ(o->metadata.name, "w-0");
  EXPECT_EQ(o->metadata.resource_version, "17");
  EXPECT_EQ(o->metadata.generation, 2);
  EXPECT_EQ(o->metadata.labels.at("tidal.dev/job"), "llama");
  ASSERT_EQ(o->metadata.owner_references.size(), 1u);
  EXPECT_TRUE(o->metadata.owner_references[0].controller);
  EXPECT_EQ(o->metadata.finalizers, (std::vector<std::string>{"tidal.dev/checkpoint"}));
  EXPECT_EQ(o->rest["status"]["podIP"], "127.0.0.5");
}

TEST(ObjectTest, RoundTripKeepsUnknownFields) {
  auto o = ObjectFromJson(kPod);
  ASSERT_TRUE(o.ok());
  o->metadata.labels["extra"] = "1";
  json back = ToJson(*o);
  EXPECT_EQ(back["metadata"]["managedFields"], kPod["metadata"]["managedFields"]);
  EXPECT_EQ(back["metadata"]["labels"]["extra"], "1");
  back["metadata"]["labels"].erase("extra");
  EXPECT_EQ(back, kPod);
}

TEST(ObjectTest, MalformedObjectsNameTheField) {
  EXPECT_NE(ObjectFromJson(json::array()).status().message().find("object"), std::string::npos);
  EXPECT_NE(ObjectFromJson({{"kind", "Pod"}}).status().message().find("apiVersion"),
            std::string::npos);
  auto bad_labels = kPod;
  bad_labels["metadata"]["labels"]["n"] = 3;
  EXPECT_NE(ObjectFromJson(bad_labels).status().message().find("metadata.labels.n"),
            std::string::npos);
  auto bad_owner = kPod;
  bad_owner["metadata"]["ownerReferences"][0]["name"] = 5;
  EXPECT_NE(ObjectFromJson(bad_owner).status().message().find("metadata.ownerReferences[0].name"),
            std::string::npos);
  auto bad_generation = kPod;
  bad_generation["metadata"]["generation"] = "two";
  EXPECT_FALSE(ObjectFromJson(bad_generation).ok());
}

}  // namespace
}  // namespace tidal::kube
