// CRD → served kinds, discovery documents, and Table printing helpers.
#include "local/registry.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include "common/yaml_json.h"
#include "local/table.h"

namespace tidal::local {
namespace {

using nlohmann::json;

json Crd() {
  return *ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/tests/fixtures/local/widget-crd.yaml");
}

TEST(Registry, CrdDeclaresItsKindWithSubresourcesAndColumns) {
  auto resources = Registry::ResourcesOfCrd(Crd());
  ASSERT_TRUE(resources.ok()) << resources.status().ToString();
  ASSERT_EQ(resources->size(), 1u);
  const ResourceInfo& r = (*resources)[0];
  EXPECT_EQ(r.kind, "Widget");
  EXPECT_TRUE(r.namespaced);
  EXPECT_TRUE(r.status_subresource);
  ASSERT_TRUE(r.scale.has_value());
  EXPECT_EQ(r.scale->spec_replicas_path, ".spec.replicas");
  EXPECT_EQ(r.printer_columns.size(), 4u);
}

TEST(Registry, InvalidCrdsNameTheField) {
  json no_schema = Crd();
  no_schema["spec"]["versions"][0].erase("schema");
  EXPECT_NE(Registry::ResourcesOfCrd(no_schema).status().message().find("openAPIV3Schema"),
            std::string::npos);
  json bad_name = Crd();
  bad_name["metadata"]["name"] = "other.test.tidal.dev";
  EXPECT_NE(Registry::ResourcesOfCrd(bad_name).status().message().find("metadata.name"),
            std::string::npos);
  json bad_scope = Crd();
  bad_scope["spec"]["scope"] = "Everywhere";
  EXPECT_NE(Registry::ResourcesOfCrd(bad_scope).status().message().find("spec.scope"),
            std::string::npos);
}

TEST(Registry, DiscoveryListsCustomKindWithStatusAndScale) {
  Registry registry;
  registry.AddCrd("widgets.test.tidal.dev", *Registry::ResourcesOfCrd(Crd()));
  auto list = registry.ResourceList("test.tidal.dev", "v1");
  ASSERT_TRUE(list.has_value());
  std::vector<std::string> names;
  for (const auto& r : (*list)["resources"]) names.push_back(r["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"widgets", "widgets/status", "widgets/scale"}));
  EXPECT_EQ((*list)["resources"][2]["kind"], "Scale");
  bool grouped = false;
  const json groups = registry.GroupList();
  for (const auto& g : groups["groups"]) grouped = grouped || g["name"] == "test.tidal.dev";
  EXPECT_TRUE(grouped);
  // kubectl's validation: the PATCH operation names the kind and takes fieldValidation.
  auto doc = registry.OpenApiGroupVersion("test.tidal.dev", "v1");
  ASSERT_TRUE(doc.has_value());
  const json& patch =
      (*doc)["paths"]["/apis/test.tidal.dev/v1/namespaces/{namespace}/widgets/{name}"]["patch"];
  EXPECT_EQ(patch["x-kubernetes-group-version-kind"]["kind"], "Widget");
  EXPECT_EQ(patch["parameters"][0]["name"], "fieldValidation");
  registry.RemoveCrd("widgets.test.tidal.dev");
  EXPECT_FALSE(registry.ResourceList("test.tidal.dev", "v1").has_value());
}

TEST(Table, HumanDurationMatchesKubectl) {
  EXPECT_EQ(HumanDuration(45), "45s");
  EXPECT_EQ(HumanDuration(190), "3m10s");
  EXPECT_EQ(HumanDuration(600), "10m");
  EXPECT_EQ(HumanDuration(3 * 3600 + 300), "3h5m");
  EXPECT_EQ(HumanDuration(30 * 3600), "30h");
  EXPECT_EQ(HumanDuration(3 * 86400 + 4 * 3600), "3d4h");
  EXPECT_EQ(HumanDuration(400 * 86400), "400d");
}

TEST(Table, CustomColumnsFollowTheirJsonPaths) {
  auto r = (*Registry::ResourcesOfCrd(Crd()))[0];
  json w = {{"metadata", {{"name", "demo"}, {"creationTimestamp", "2026-01-01T00:00:00Z"}}},
            {"spec", {{"replicas", 3}, {"color", "red"}}}};
  std::tm one_am{};
  one_am.tm_year = 126;
  one_am.tm_mday = 1;
  one_am.tm_hour = 1;
  json table = ToTable(r, {w}, true, "7", timegm(&one_am));
  std::vector<std::string> headers;
  for (const auto& c : table["columnDefinitions"]) headers.push_back(c["name"]);
  EXPECT_EQ(headers, (std::vector<std::string>{"Name", "Replicas", "Color", "Phase", "Age"}));
  EXPECT_EQ(table["rows"][0]["cells"], json({"demo", 3, "red", "<none>", "60m"}));
}

}  // namespace
}  // namespace tidal::local
