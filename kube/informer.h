// kube/informer.h — the informer cache (client-go's SharedIndexInformer, kube-rs's
// reflector + Store): a Watcher feeds a thread-safe Store of the latest version of every
// object, with indexes, and calls event handlers after each change. Readers read the store and
// never write it; the watcher thread is its only writer.
//
// Memory: every object is held once, as shared_ptr<const json> (readers get the same pointer,
// no copies); indexes hold pointers to the store's own key strings; the watcher keeps versions
// only (WatcherCore::KeepingVersionsOnly). metadata.managedFields is dropped before storing by
// default (controller-runtime's cache.TransformStripManagedFields), since no reader needs it,
// and so is kubectl's last-applied-configuration annotation (a copy of the applied manifest).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kube/client.h"
#include "kube/labels.h"
#include "kube/request.h"
#include "kube/watcher.h"

namespace tidal::kube {

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

// "namespace/name", or "name" for cluster-scoped objects (client-go's MetaNamespaceKeyFunc).
std::string ObjectKey(const nlohmann::json& object);
std::string ObjectKey(const std::string& ns, const std::string& name);

// The values an object is filed under in one index (client-go's IndexFunc).
using IndexFunc = std::function<std::vector<std::string>(const nlohmann::json& object)>;

// The built-in indexes.
inline constexpr const char* kNamespaceIndex = "namespace";    // metadata.namespace
inline constexpr const char* kLabelIndex = "label";            // "key=value" per label
inline constexpr const char* kOwnerIndex = "owner";            // every ownerReferences[].uid
inline constexpr const char* kControllerIndex = "controller";  // the controller: true owner's uid

// A change the store made, as event handlers see it.
struct StoreChange {
  ObjectEvent::Type type;
  ObjectPtr old_object;  // null for kAdded
  ObjectPtr object;      // for kDeleted: the last version the store held
};

class Store {
 public:
  Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Adds an index (indexing what is stored already). InvalidArgument if the name is taken.
  Status AddIndex(const std::string& name, IndexFunc func);

  // Applies one watcher event. ADDED of a known key updates it; MODIFIED of an unknown one adds
  // it; DELETED of an unknown key changes nothing (nullopt). A deletion that carries only
  // metadata (a relist's) reports the last version the store held.
  std::optional<StoreChange> Apply(ObjectEvent event);

  ObjectPtr Get(const std::string& ns, const std::string& name) const;
  ObjectPtr GetByKey(const std::string& key) const;
  // All objects in `ns`; every object when ns is "". Sorted by key.
  std::vector<ObjectPtr> List(const std::string& ns = "") const;
  std::vector<std::string> ListKeys() const;
  // Objects filed under `value` in index `name` (empty if the index does not exist).
  std::vector<ObjectPtr> ByIndex(const std::string& name, const std::string& value) const;
  std::vector<ObjectPtr> ByLabel(const std::string& key, const std::string& value) const;
  // Objects in `ns` ("" = all) whose labels match; narrowed through the label index by the
  // selector's equality requirements, when it has any.
  std::vector<ObjectPtr> Select(const LabelSelector& selector, const std::string& ns = "") const;
  // Objects with an ownerReference to `uid`; ByController: only where that owner is the
  // controller (controller: true), as controller-runtime's Owns() maps them.
  std::vector<ObjectPtr> ByOwner(const std::string& uid) const;
  std::vector<ObjectPtr> ByController(const std::string& uid) const;
  // The distinct values of an index (e.g. which namespaces hold objects).
  std::vector<std::string> IndexValues(const std::string& name) const;

  size_t size() const;
  // An estimate of the heap this store holds: the objects (JSON trees walked node by node,
  // with allocator overhead), the key map and the indexes. Maintained as objects come and go,
  // so reading it is O(1).
  size_t ApproximateBytes() const;

 private:
  struct KeyPtrLess {
    bool operator()(const std::string* a, const std::string* b) const { return *a < *b; }
  };
  using KeySet = std::set<const std::string*, KeyPtrLess>;  // points at items_' keys
  struct Entry {
    ObjectPtr object;
    size_t bytes = 0;  // of the object
  };
  struct Index {
    IndexFunc func;
    std::unordered_map<std::string, KeySet> by_value;
  };

  void IndexLocked(Index& index, const std::string* key, const nlohmann::json& object);
  void UnindexLocked(Index& index, const std::string* key, const nlohmann::json& object);
  std::vector<ObjectPtr> ObjectsLocked(const KeySet& keys) const;

  mutable std::mutex mu_;
  std::map<std::string, Entry> items_;  // node-based: the key strings never move
  std::map<std::string, Index> indexes_;
  size_t bytes_ = 0;
};

// Drops metadata.managedFields and the annotation kubectl apply keeps its last manifest in
// (kubectl.kubernetes.io/last-applied-configuration): bookkeeping of the writers, which no
// reader of a cache needs. (A status write replaces only the status: neither is lost.)
void StripManagedFields(nlohmann::json& object);

struct InformerOptions {
  Resource resource;
  std::string namespace_;      // "" for all namespaces
  std::string label_selector;  // server-side filter of what is cached
  // Applied to every object before it is stored and handed to handlers; null for none.
  std::function<void(nlohmann::json&)> transform = StripManagedFields;
  // Called with every event's object as the server sent it, before the transform, the store
  // and the handlers, on the informer's thread: where a typed cache (kube::PodCache) takes
  // what the transform then drops. (A deletion a relist finds carries only metadata.)
  std::function<void(ObjectEvent::Type type, const nlohmann::json& object)> observe;
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{std::chrono::seconds(30)};
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(90)};
};

// Handlers run on the informer's thread, after the store has changed (so a handler that reads
// the store sees the new state), in event order. They must not block: enqueue a key and return.
struct EventHandler {
  std::function<void(const ObjectPtr& object)> on_add;
  std::function<void(const ObjectPtr& old_object, const ObjectPtr& object)> on_update;
  std::function<void(const ObjectPtr& last_known)> on_delete;
};

class Informer {
 public:
  Informer(KubeClient& client, InformerOptions options);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Before Start (FailedPrecondition after): handlers see every event from the first list on.
  Status AddEventHandler(EventHandler handler);
  Status AddIndex(const std::string& name, IndexFunc func) { return store_.AddIndex(name, func); }
  // Starts listing and watching. FailedPrecondition when already started or stopped.
  Status Start();
  void Stop();

  // True once the first list has been stored and its events handled.
  bool HasSynced() const { return synced_.load(); }
  // Blocks until HasSynced or the timeout (client-go's WaitForCacheSync); false on timeout or
  // when stopped first.
  bool WaitForSync(std::chrono::milliseconds timeout) const;

  const Store& store() const { return store_; }
  int relists() const;

 private:
  void OnEvent(const ObjectEvent& event);
  void OnListed();

  KubeClient& client_;
  InformerOptions options_;
  Store store_;
  std::vector<EventHandler> handlers_;
  std::unique_ptr<Watcher> watcher_;
  mutable std::mutex mu_;
  mutable std::condition_variable synced_cv_;
  std::atomic<bool> synced_{false};
  bool started_ = false, stopped_ = false;
};

}  // namespace tidal::kube
