// The informer against a real `tidal local`: the cache and its namespace, label, owner and
// controller indexes converge on what the server holds — after the first list, while objects
// are created, relabelled and deleted, and after the garbage collector removes dependents of a
// deleted owner — and handlers see adds, updates (with the old object) and deletes.
#include "kube/informer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "kube/pod_cache.h"
#include "tests/integration/kube/local_cluster.h"

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

json ConfigMap(const std::string& name, json labels, std::vector<json> owners = {}) {
  json meta = {{"name", name}, {"labels", labels}};
  if (!owners.empty()) meta["ownerReferences"] = owners;
  return {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", meta}, {"data", {{"k", "v"}}}};
}

// A pod no node can take (nodeSelector matches nothing): it stays Pending, nothing runs.
json Pod(const std::string& name, json labels, std::vector<json> owners = {}) {
  json meta = {{"name", name}, {"labels", labels}};
  if (!owners.empty()) meta["ownerReferences"] = owners;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", meta},
          {"spec",
           {{"nodeSelector", {{"tidal.dev/test", "nowhere"}}},
            {"containers", {{{"name", "w"}, {"image", "tidal-worker"}}}}}}};
}

json OwnerRef(const json& owner, bool controller) {
  json ref = {{"apiVersion", owner["apiVersion"]},
              {"kind", owner["kind"]},
              {"name", owner["metadata"]["name"]},
              {"uid", owner["metadata"]["uid"]}};
  if (controller) ref["controller"] = true;
  return ref;
}

std::set<std::string> Names(const std::vector<ObjectPtr>& objects) {
  std::set<std::string> out;
  for (const auto& o : objects) out.insert((*o)["metadata"]["name"].get<std::string>());
  return out;
}
using NameSet = std::set<std::string>;

// What handlers saw, as "+name", "~name:oldLabel>newLabel", "-name".
struct HandlerLog {
  std::mutex mu;
  std::vector<std::string> entries;
  void Push(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    entries.push_back(std::move(s));
  }
  bool Contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(entries.begin(), entries.end(), s) != entries.end();
  }
  std::vector<std::string> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return entries;
  }
};

EventHandler Recording(HandlerLog& log) {
  auto app = [](const ObjectPtr& o) {
    const json& labels = (*o)["metadata"].value("labels", json::object());
    return labels.value("app", std::string("-"));
  };
  EventHandler h;
  h.on_add = [&log](const ObjectPtr& o) {
    log.Push("+" + (*o)["metadata"]["name"].get<std::string>());
  };
  h.on_update = [&log, app](const ObjectPtr& old, const ObjectPtr& now) {
    log.Push("~" + (*now)["metadata"]["name"].get<std::string>() + ":" + app(old) + ">" + app(now));
  };
  h.on_delete = [&log](const ObjectPtr& o) {
    log.Push("-" + (*o)["metadata"]["name"].get<std::string>());
  };
  return h;
}

class InformerIntegration : public LocalClusterTest {
 protected:
  // name → resourceVersion, from the server and from the cache: equal once converged.
  std::map<std::string, std::string> ServerView(const Resource& r, const std::string& ns) {
    std::map<std::string, std::string> out;
    auto list = client_->Call(*ListRequest(r, ns, {}));
    EXPECT_TRUE(list.ok()) << list.status().ToString();
    if (list.ok())
      for (const auto& item : (*list)["items"])
        out[ObjectKey(item)] = item["metadata"]["resourceVersion"];
    return out;
  }
  static std::map<std::string, std::string> CacheView(const Informer& informer) {
    std::map<std::string, std::string> out;
    for (const auto& o : informer.store().List())
      out[ObjectKey(*o)] = (*o)["metadata"]["resourceVersion"];
    return out;
  }
  bool Converged(const Informer& informer, const Resource& r, const std::string& ns) {
    return WaitUntil([&] { return CacheView(informer) == ServerView(r, ns); });
  }
};

TEST_F(InformerIntegration, ConfigMapCacheAndIndexesConvergeThroughChangesAndGarbageCollection) {
  const Resource cms = Resource::ConfigMaps();
  json owner = Create(cms, "default", ConfigMap("owner", {{"role", "owner"}}));
  const std::string owner_uid = owner["metadata"]["uid"];
  Create(cms, "default",
         ConfigMap("cm-a", {{"app", "w"}, {"tier", "gpu"}}, {OwnerRef(owner, true)}));
  Create(cms, "default",
         ConfigMap("cm-b", {{"app", "w"}, {"tier", "cpu"}}, {OwnerRef(owner, false)}));
  Create(cms, "default", ConfigMap("cm-c", {{"app", "x"}}));

  InformerOptions options;
  options.resource = cms;
  options.namespace_ = "default";
  options.initial_backoff = 100ms;
  Informer informer(*client_, options);
  HandlerLog log;
  ASSERT_TRUE(informer.AddEventHandler(Recording(log)).ok());
  EXPECT_FALSE(informer.HasSynced());
  ASSERT_TRUE(informer.Start().ok());
  EXPECT_EQ(informer.AddEventHandler(Recording(log)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(informer.Start().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(informer.WaitForSync(30s));
  ASSERT_TRUE(informer.HasSynced());

  // Synced means the first list is in the cache and its adds were handled.
  const Store& store = informer.store();
  EXPECT_EQ(store.size(), 4u);
  EXPECT_EQ(CacheView(informer), ServerView(cms, "default"));
  for (const char* name : {"+owner", "+cm-a", "+cm-b", "+cm-c"})
    EXPECT_TRUE(log.Contains(name)) << name;
  EXPECT_EQ(Names(store.ByLabel("app", "w")), (NameSet{"cm-a", "cm-b"}));
  EXPECT_EQ(Names(store.ByOwner(owner_uid)), (NameSet{"cm-a", "cm-b"}));
  EXPECT_EQ(Names(store.ByController(owner_uid)), (NameSet{"cm-a"}));
  EXPECT_EQ(Names(store.Select(*LabelSelector::Parse("app=w,tier!=cpu"), "default")),
            (NameSet{"cm-a"}));
  EXPECT_EQ(Names(store.List("default")), (NameSet{"owner", "cm-a", "cm-b", "cm-c"}));
  ASSERT_NE(store.Get("default", "cm-c"), nullptr);
  EXPECT_EQ((*store.Get("default", "cm-c"))["data"]["k"], "v");
  EXPECT_FALSE((*store.Get("default", "cm-c"))["metadata"].contains("managedFields"));

  // Live changes: a new object, a relabel, a delete.
  Create(cms, "default", ConfigMap("cm-d", {{"app", "w"}}, {OwnerRef(owner, true)}));
  ASSERT_TRUE(client_
                  ->Call(*MergePatchRequest(cms, "default", "cm-a",
                                            {{"metadata", {{"labels", {{"app", "x"}}}}}}))
                  .ok());
  ASSERT_TRUE(client_->Call(*DeleteRequest(cms, "default", "cm-c")).ok());
  ASSERT_TRUE(Converged(informer, cms, "default")) << ::testing::PrintToString(log.Snapshot());
  EXPECT_EQ(Names(store.ByLabel("app", "w")), (NameSet{"cm-b", "cm-d"}));
  EXPECT_EQ(Names(store.ByLabel("app", "x")), (NameSet{"cm-a"}));
  EXPECT_EQ(Names(store.ByController(owner_uid)), (NameSet{"cm-a", "cm-d"}));
  EXPECT_EQ(store.Get("default", "cm-c"), nullptr);
  EXPECT_TRUE(log.Contains("+cm-d"));
  EXPECT_TRUE(log.Contains("~cm-a:w>x")) << "update handlers get the old and the new object";
  EXPECT_TRUE(log.Contains("-cm-c"));

  // Deleting the owner: the server's garbage collector deletes its dependents; the cache and
  // the owner indexes follow.
  DeleteOptions background;
  background.propagation_policy = "Background";
  ASSERT_TRUE(client_->Call(*DeleteRequest(cms, "default", "owner", background)).ok());
  ASSERT_TRUE(WaitUntil([&] { return store.ByOwner(owner_uid).empty() && store.size() == 0; }))
      << ::testing::PrintToString(store.ListKeys());
  EXPECT_TRUE(store.ByController(owner_uid).empty());
  EXPECT_TRUE(store.IndexValues(kLabelIndex).empty());
  EXPECT_TRUE(store.IndexValues(kOwnerIndex).empty());
  EXPECT_TRUE(Converged(informer, cms, "default"));
  for (const char* name : {"-owner", "-cm-a", "-cm-b", "-cm-d"})
    EXPECT_TRUE(log.Contains(name)) << name;
  EXPECT_EQ(informer.relists(), 1) << "one list, then a watch throughout";
}

TEST_F(InformerIntegration, PodCacheAcrossNamespacesWithLabelsAndOwners) {
  const Resource pods = Resource::Pods();
  Create({"", "v1", "namespaces", false}, "",
         {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}});
  json job = Create(Resource::ConfigMaps(), "default", ConfigMap("job", {}));
  const std::string job_uid = job["metadata"]["uid"];
  for (int i = 0; i < 3; ++i)
    Create(pods, "default",
           Pod("worker-" + std::to_string(i),
               {{"tidal.dev/job", "job"}, {"tidal.dev/rank", std::to_string(i)}},
               {OwnerRef(job, true)}));
  Create(pods, "team-b", Pod("other", {{"app", "other"}}));

  InformerOptions options;
  options.resource = pods;  // all namespaces
  options.initial_backoff = 100ms;
  Informer informer(*client_, options);
  ASSERT_TRUE(informer.Start().ok());
  ASSERT_TRUE(informer.WaitForSync(30s));
  const Store& store = informer.store();
  ASSERT_TRUE(Converged(informer, pods, ""));
  EXPECT_EQ(Names(store.List("default")), (NameSet{"worker-0", "worker-1", "worker-2"}));
  EXPECT_EQ(Names(store.List("team-b")), (NameSet{"other"}));
  EXPECT_EQ(store.IndexValues(kNamespaceIndex), (std::vector<std::string>{"default", "team-b"}));
  EXPECT_EQ(Names(store.ByController(job_uid)), (NameSet{"worker-0", "worker-1", "worker-2"}));
  EXPECT_EQ(Names(store.Select(*LabelSelector::Parse("tidal.dev/job=job,tidal.dev/rank in (0,2)"))),
            (NameSet{"worker-0", "worker-2"}));
  EXPECT_NE(store.Get("team-b", "other"), nullptr);
  // The memory estimate is there and plausible (a pending Pod is a few kB as a JSON tree).
  size_t per_pod = store.ApproximateBytes() / store.size();
  EXPECT_GT(per_pod, 500u);
  EXPECT_LT(per_pod, 64u * 1024u);
  ::testing::Test::RecordProperty("approximate_bytes_per_pod", std::to_string(per_pod));

  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->Call(*DeleteRequest(pods, "default", "worker-1", now)).ok());
  ASSERT_TRUE(client_->Call(*DeleteRequest(pods, "team-b", "other", now)).ok());
  ASSERT_TRUE(Converged(informer, pods, ""));
  EXPECT_EQ(Names(store.ByController(job_uid)), (NameSet{"worker-0", "worker-2"}));
  EXPECT_EQ(store.IndexValues(kNamespaceIndex), (std::vector<std::string>{"default"}));
  EXPECT_TRUE(store.ByLabel("app", "other").empty());
}

// The operator's pod cache (controller.cc, capacity.cc): the store keeps each pod's identity and
// owner, the typed cache what the controller reads, both fed by the same events — the cache first,
// so a handler that enqueues a key finds the pod there.
TEST_F(InformerIntegration, ATypedPodCacheFedByTheObserveHookFollowsTheServerBeforeTheHandlers) {
  const Resource pods = Resource::Pods();
  json job = Create(Resource::ConfigMaps(), "default", ConfigMap("owner", {}));
  const std::string job_uid = job["metadata"]["uid"];
  PodCacheOptions kept;
  kept.labels = {"tidal.dev/rank"};
  PodCache cache(kept);
  InformerOptions options;
  options.resource = pods;
  options.initial_backoff = 100ms;
  options.transform = KeepIdentity;
  options.observe = [&](ObjectEvent::Type type, const json& pod) { cache.Apply(type, pod); };
  Informer informer(*client_, options);
  std::atomic<int> handled{0}, missing{0};
  auto check = [&](const ObjectPtr& o) {
    ++handled;
    const json& md = (*o)["metadata"];
    if (!cache.Get(md["namespace"], md["name"])) ++missing;
  };
  ASSERT_TRUE(informer
                  .AddEventHandler(
                      {check, [&](const ObjectPtr&, const ObjectPtr& o) { check(o); }, nullptr})
                  .ok());
  ASSERT_TRUE(informer.Start().ok());
  ASSERT_TRUE(informer.WaitForSync(30s));
  for (int i = 0; i < 3; ++i)
    Create(pods, "default",
           Pod("cached-" + std::to_string(i), {{"tidal.dev/rank", std::to_string(i)}},
               {OwnerRef(job, true)}));
  ASSERT_TRUE(WaitUntil([&] { return cache.ByController(job_uid).size() == 3; }));
  // Each event reaches the cache (the observe hook) first, then the store, then the handlers:
  // the store may still be applying the last one when the cache has it.
  ASSERT_TRUE(WaitUntil([&] { return informer.store().ByController(job_uid).size() == 3; }));
  ASSERT_TRUE(WaitUntil([&] { return handled.load() >= 3; })) << "the handlers saw no pod";
  EXPECT_EQ(missing.load(), 0) << "a handler ran before the cache had the pod";
  const auto cached = cache.Get("default", "cached-1");
  ASSERT_TRUE(cached);
  EXPECT_EQ(cached->Label("tidal.dev/rank"), "1");
  EXPECT_EQ(cached->phase, kube::PodPhase::kPending);
  // The store holds what KeepIdentity keeps, and its owner index still works.
  ObjectPtr stub = informer.store().Get("default", "cached-1");
  ASSERT_TRUE(stub);
  EXPECT_FALSE(stub->contains("spec"));
  EXPECT_FALSE(stub->contains("status"));
  EXPECT_EQ(Names(informer.store().ByController(job_uid)),
            (NameSet{"cached-0", "cached-1", "cached-2"}));

  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->Call(*DeleteRequest(pods, "default", "cached-1", now)).ok());
  ASSERT_TRUE(WaitUntil([&] { return cache.Get("default", "cached-1") == nullptr; }));
  EXPECT_EQ(cache.ByController(job_uid).size(), 2u);
}

TEST_F(InformerIntegration, ServerSideLabelSelectorLimitsWhatIsCached) {
  const Resource cms = Resource::ConfigMaps();
  Create(cms, "default", ConfigMap("mine", {{"tidal.dev/managed", "true"}}));
  Create(cms, "default", ConfigMap("theirs", {{"app", "x"}}));
  InformerOptions options;
  options.resource = cms;
  options.namespace_ = "default";
  options.label_selector = "tidal.dev/managed=true";
  Informer informer(*client_, options);
  ASSERT_TRUE(informer.Start().ok());
  ASSERT_TRUE(informer.WaitForSync(30s));
  EXPECT_EQ(informer.store().ListKeys(), (std::vector<std::string>{"default/mine"}));

  InformerOptions bad = options;
  bad.label_selector = "a in (";
  Informer refused(*client_, bad);
  EXPECT_EQ(refused.Start().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(refused.WaitForSync(100ms));
}

}  // namespace
}  // namespace tidal::kube
