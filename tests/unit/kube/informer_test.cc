// The informer's store fed with watcher events directly: latest version per key, the namespace,
// label, owner and controller indexes kept right across updates and deletes, label selectors,
// custom indexes, single storage of each object, and the memory estimate.
#include "kube/informer.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using nlohmann::json;

json Owner(const std::string& uid, bool controller) {
  json ref = {{"apiVersion", "tidal.dev/v1alpha1"},
              {"kind", "TrainingJob"},
              {"name", "job-" + uid},
              {"uid", uid}};
  if (controller) ref["controller"] = true;
  return ref;
}

json Pod(const std::string& ns, const std::string& name, int rv, json labels = json::object(),
         std::vector<json> owners = {}) {
  json meta = {{"namespace", ns},
               {"name", name},
               {"resourceVersion", std::to_string(rv)},
               {"labels", labels}};
  if (!owners.empty()) meta["ownerReferences"] = owners;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", {{"x", rv}}}};
}

std::vector<std::string> Names(const std::vector<ObjectPtr>& objects) {
  std::vector<std::string> out;
  for (const auto& o : objects) out.push_back((*o)["metadata"]["name"]);
  return out;
}
using Strings = std::vector<std::string>;

TEST(InformerStore, KeepsTheLatestVersionPerKey) {
  Store store;
  auto added = store.Apply({ObjectEvent::kAdded, Pod("a", "p", 1)});
  ASSERT_TRUE(added);
  EXPECT_EQ(added->type, ObjectEvent::kAdded);
  EXPECT_EQ(added->old_object, nullptr);
  auto updated = store.Apply({ObjectEvent::kModified, Pod("a", "p", 2)});
  ASSERT_TRUE(updated);
  EXPECT_EQ(updated->type, ObjectEvent::kModified);
  EXPECT_EQ((*updated->old_object)["metadata"]["resourceVersion"], "1");
  EXPECT_EQ((*updated->object)["metadata"]["resourceVersion"], "2");
  EXPECT_EQ((*store.Get("a", "p"))["metadata"]["resourceVersion"], "2");
  EXPECT_EQ(store.Get("b", "p"), nullptr);
  EXPECT_EQ(store.size(), 1u);
  // ADDED of a known key is an update; MODIFIED of an unknown key an add.
  EXPECT_EQ(store.Apply({ObjectEvent::kAdded, Pod("a", "p", 3)})->type, ObjectEvent::kModified);
  EXPECT_EQ(store.Apply({ObjectEvent::kModified, Pod("a", "q", 1)})->type, ObjectEvent::kAdded);
  EXPECT_EQ(store.ListKeys(), (Strings{"a/p", "a/q"}));
}

TEST(InformerStore, ReadersShareTheStoredObject) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p", 1)});
  ObjectPtr one = store.Get("a", "p");
  ObjectPtr two = store.List("a").at(0);
  EXPECT_EQ(one.get(), two.get()) << "one copy, handed out by pointer";
  store.Apply({ObjectEvent::kModified, Pod("a", "p", 2)});
  EXPECT_EQ((*one)["metadata"]["resourceVersion"], "1") << "a reader's snapshot stays valid";
}

TEST(InformerStore, DeleteRemovesFromEveryIndexAndReportsTheLastVersion) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p", 1, {{"app", "w"}}, {Owner("u1", true)})});
  auto gone = store.Apply({ObjectEvent::kDeleted, Pod("a", "p", 5, {{"app", "w"}})});
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->type, ObjectEvent::kDeleted);
  EXPECT_EQ((*gone->object)["metadata"]["resourceVersion"], "5") << "the watch's final state";
  EXPECT_EQ(store.size(), 0u);
  EXPECT_TRUE(store.List("a").empty());
  EXPECT_TRUE(store.ByLabel("app", "w").empty());
  EXPECT_TRUE(store.ByOwner("u1").empty());
  EXPECT_TRUE(store.ByController("u1").empty());
  EXPECT_TRUE(store.IndexValues(kLabelIndex).empty()) << "empty index values are dropped";
  EXPECT_FALSE(store.Apply({ObjectEvent::kDeleted, Pod("a", "p", 6)})) << "unknown: no change";
}

TEST(InformerStore, RelistDeletionWithOnlyMetadataReportsWhatTheStoreHeld) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p", 3, {{"app", "w"}})});
  json stub = {{"metadata", {{"namespace", "a"}, {"name", "p"}, {"resourceVersion", "3"}}}};
  auto gone = store.Apply({ObjectEvent::kDeleted, stub});
  ASSERT_TRUE(gone);
  EXPECT_EQ((*gone->object)["kind"], "Pod");
  EXPECT_EQ((*gone->object)["metadata"]["labels"]["app"], "w");
}

TEST(InformerStore, NamespaceIndexAndList) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p1", 1)});
  store.Apply({ObjectEvent::kAdded, Pod("b", "p2", 2)});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p3", 3)});
  json node = {{"apiVersion", "v1"},
               {"kind", "Node"},
               {"metadata", {{"name", "n1"}, {"resourceVersion", "4"}}}};
  store.Apply({ObjectEvent::kAdded, node});
  EXPECT_EQ(Names(store.List("a")), (Strings{"p1", "p3"}));
  EXPECT_EQ(Names(store.List("b")), (Strings{"p2"}));
  EXPECT_TRUE(store.List("c").empty());
  EXPECT_EQ(store.List().size(), 4u);
  EXPECT_EQ(store.ListKeys(), (Strings{"a/p1", "a/p3", "b/p2", "n1"}));
  EXPECT_NE(store.Get("", "n1"), nullptr) << "cluster-scoped objects are keyed by name";
  EXPECT_EQ(store.IndexValues(kNamespaceIndex), (Strings{"a", "b"}));
}

TEST(InformerStore, LabelIndexFollowsLabelChanges) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p1", 1, {{"app", "w"}, {"gen", "1"}})});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p2", 2, {{"app", "w"}, {"gen", "2"}})});
  store.Apply({ObjectEvent::kAdded, Pod("b", "p3", 3, {{"app", "x"}})});
  EXPECT_EQ(Names(store.ByLabel("app", "w")), (Strings{"p1", "p2"}));
  store.Apply({ObjectEvent::kModified, Pod("a", "p1", 4, {{"app", "w"}, {"gen", "2"}})});
  EXPECT_TRUE(store.ByLabel("gen", "1").empty());
  EXPECT_EQ(Names(store.ByLabel("gen", "2")), (Strings{"p1", "p2"}));
  store.Apply({ObjectEvent::kModified, Pod("a", "p2", 5, {{"app", "x"}})});
  EXPECT_EQ(Names(store.ByLabel("app", "w")), (Strings{"p1"}));
  EXPECT_EQ(Names(store.ByLabel("app", "x")), (Strings{"p2", "p3"}));
  EXPECT_EQ(Names(store.ByLabel("gen", "2")), (Strings{"p1"}));
}

TEST(InformerStore, SelectMatchesSelectorsWithinANamespace) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p1", 1, {{"app", "w"}, {"tier", "gpu"}})});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p2", 2, {{"app", "w"}, {"tier", "cpu"}})});
  store.Apply({ObjectEvent::kAdded, Pod("b", "p3", 3, {{"app", "w"}, {"tier", "gpu"}})});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p4", 4)});
  auto sel = [](const char* s) { return *LabelSelector::Parse(s); };
  EXPECT_EQ(Names(store.Select(sel("app=w,tier=gpu"))), (Strings{"p1", "p3"}));
  EXPECT_EQ(Names(store.Select(sel("app=w,tier=gpu"), "a")), (Strings{"p1"}));
  EXPECT_EQ(Names(store.Select(sel("tier in (cpu,gpu)"), "a")), (Strings{"p1", "p2"}));
  EXPECT_EQ(Names(store.Select(sel("tier!=gpu"), "a")), (Strings{"p2", "p4"}));
  EXPECT_EQ(Names(store.Select(sel("!app"))), (Strings{"p4"}));
  EXPECT_EQ(Names(store.Select(sel(""), "a")), (Strings{"p1", "p2", "p4"}));
  EXPECT_TRUE(store.Select(sel("app=nothing")).empty());
}

TEST(InformerStore, OwnerAndControllerIndexes) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p1", 1, {}, {Owner("job1", true)})});
  store.Apply(
      {ObjectEvent::kAdded, Pod("a", "p2", 2, {}, {Owner("job1", false), Owner("job2", true)})});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p3", 3)});
  EXPECT_EQ(Names(store.ByOwner("job1")), (Strings{"p1", "p2"}));
  EXPECT_EQ(Names(store.ByController("job1")), (Strings{"p1"}));
  EXPECT_EQ(Names(store.ByController("job2")), (Strings{"p2"}));
  // Adoption moves p1 from job1 to job2.
  store.Apply({ObjectEvent::kModified, Pod("a", "p1", 4, {}, {Owner("job2", true)})});
  EXPECT_EQ(Names(store.ByOwner("job1")), (Strings{"p2"}));
  EXPECT_TRUE(store.ByController("job1").empty());
  EXPECT_EQ(Names(store.ByController("job2")), (Strings{"p1", "p2"}));
  EXPECT_EQ(store.IndexValues(kOwnerIndex), (Strings{"job1", "job2"}));
}

TEST(InformerStore, CustomIndexIndexesWhatIsAlreadyStored) {
  Store store;
  store.Apply({ObjectEvent::kAdded, Pod("a", "p1", 1)});
  store.Apply({ObjectEvent::kAdded, Pod("a", "p2", 2)});
  auto by_x = [](const json& o) {
    return std::vector<std::string>{std::to_string(o["spec"]["x"].get<int>() % 2)};
  };
  ASSERT_TRUE(store.AddIndex("parity", by_x).ok());
  EXPECT_EQ(store.AddIndex("parity", by_x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.AddIndex(kLabelIndex, by_x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Names(store.ByIndex("parity", "1")), (Strings{"p1"}));
  store.Apply({ObjectEvent::kAdded, Pod("a", "p3", 3)});
  EXPECT_EQ(Names(store.ByIndex("parity", "1")), (Strings{"p1", "p3"}));
  EXPECT_TRUE(store.ByIndex("no-such-index", "1").empty());
}

TEST(InformerStore, MemoryEstimateGrowsWithObjectsAndReturnsToZero) {
  Store store;
  EXPECT_EQ(store.ApproximateBytes(), 0u);
  json big = Pod("a", "big", 1, {{"app", "w"}}, {Owner("u", true)});
  big["spec"]["payload"] = std::string(10000, 'x');
  store.Apply({ObjectEvent::kAdded, big});
  size_t one = store.ApproximateBytes();
  EXPECT_GT(one, 10000u);
  EXPECT_LT(one, 10000u + 8192u) << "a 10 kB string plus a small tree";
  store.Apply({ObjectEvent::kAdded, Pod("a", "small", 2, {{"app", "w"}})});
  size_t two = store.ApproximateBytes();
  EXPECT_GT(two, one);
  big["metadata"]["resourceVersion"] = "3";
  big["spec"]["payload"] = std::string(20000, 'x');
  store.Apply({ObjectEvent::kModified, big});
  EXPECT_GT(store.ApproximateBytes(), two + 9000u);
  store.Apply({ObjectEvent::kDeleted, big});
  store.Apply({ObjectEvent::kDeleted, Pod("a", "small", 4)});
  EXPECT_EQ(store.ApproximateBytes(), 0u) << "every byte added is taken off again";
}

TEST(InformerStore, StripManagedFieldsDropsOnlyThemAndKubectlsLastAppliedManifest) {
  json pod = Pod("a", "p", 1);
  pod["metadata"]["managedFields"] = json::array({{{"manager", "kubectl"}}});
  pod["metadata"]["annotations"] = {
      {"kubectl.kubernetes.io/last-applied-configuration", "{\"kind\":\"Pod\"}"},
      {"tidal.dev/note", "kept"}};
  StripManagedFields(pod);
  EXPECT_FALSE(pod["metadata"].contains("managedFields"));
  EXPECT_EQ(pod["metadata"]["annotations"], json({{"tidal.dev/note", "kept"}}));
  EXPECT_EQ(pod["metadata"]["name"], "p");
  json applied_only = Pod("a", "q", 1);
  applied_only["metadata"]["annotations"] = {
      {"kubectl.kubernetes.io/last-applied-configuration", "{}"}};
  StripManagedFields(applied_only);
  EXPECT_FALSE(applied_only["metadata"].contains("annotations")) << applied_only.dump();
  json odd = {{"metadata", "not an object"}};
  StripManagedFields(odd);  // harmless
  EXPECT_EQ(odd["metadata"], "not an object");
}

TEST(InformerStore, ConcurrentReadersSeeConsistentObjects) {
  Store store;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int rv = 1; rv <= 2000; ++rv) {
      store.Apply({ObjectEvent::kModified,
                   Pod("a", "p" + std::to_string(rv % 10), rv, {{"v", std::to_string(rv % 3)}})});
    }
    done = true;
  });
  int checks = 0;
  while (!done.load()) {
    for (const auto& o : store.Select(*LabelSelector::Parse("v=1"), "a")) {
      ASSERT_EQ((*o)["metadata"]["labels"]["v"], "1");
      ++checks;
    }
  }
  writer.join();
  EXPECT_EQ(store.size(), 10u);
  (void)checks;
}

}  // namespace
}  // namespace tidal::kube
