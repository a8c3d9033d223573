// local/store.h — `tidal local`'s object storage: every object of every kind, one
// global resourceVersion counter, and a bounded history of changes for watches. Durable: a
// write is committed to SQLite (WAL, synchronous=FULL) before the call returns, so after a
// kill -9 every acknowledged object comes back with the same resourceVersion, and watchers
// can resume from any version still in the history. As etcd under kube-apiserver, it knows
// nothing of kinds or schemas: objects are JSON under a key; the API layer does the rest.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

struct sqlite3;

namespace tidal::local {

// Where an object lives: "<group>/<plural>" and namespace/name ("" namespace: cluster scope).
struct ObjectKey {
  std::string resource;  // e.g. "tidal.dev/trainingjobs", "/pods" for the core group
  std::string namespace_;
  std::string name;
  std::string ToString() const { return resource + "/" + namespace_ + "/" + name; }
  auto operator<=>(const ObjectKey&) const = default;
};

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

struct WatchEvent {
  enum Type { kAdded, kModified, kDeleted } type;
  int64_t resource_version;
  ObjectKey key;
  ObjectPtr object;  // for kDeleted, the last state (with the deletion's resourceVersion)
};
const char* EventTypeName(WatchEvent::Type type);

class Store {
 public:
  // Opens (creating if needed) DIR/store.db. `history_size`: how many past changes a watch can
  // start from; older versions answer 410 Gone, as etcd after compaction.
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& dir, size_t history_size);
  ~Store();

  int64_t CurrentVersion() const;
  ObjectPtr Get(const ObjectKey& key) const;
  // Every object of `resource` (in `namespace_`, or all when empty), ordered by key.
  std::vector<ObjectPtr> List(const std::string& resource, const std::string& namespace_) const;

  // The write operations stamp metadata.resourceVersion with the next version and persist.
  // `expected_version`: when set, the write fails with FailedPrecondition unless the stored
  // object has that version (compare-and-swap, the basis of 409 Conflict).
  StatusOr<ObjectPtr> Create(const ObjectKey& key, nlohmann::json object);
  StatusOr<ObjectPtr> Update(const ObjectKey& key, nlohmann::json object,
                             const std::optional<int64_t>& expected_version);
  StatusOr<ObjectPtr> Delete(const ObjectKey& key, const std::optional<int64_t>& expected_version);

  // Changes after `after_version` for `resource` (all resources when empty), waiting up to
  // `wait` for at least one. Gone (FailedPrecondition with "too old") when `after_version`
  // predates the history.
  struct Changes {
    std::vector<WatchEvent> events;
    int64_t scanned_to = 0;  // every change up to this version was looked at
  };
  StatusOr<Changes> EventsAfter(int64_t after_version, const std::string& resource,
                                std::chrono::milliseconds wait) const;
  // The oldest version a watch may still start from.
  int64_t OldestWatchableVersion() const;
  // Wakes every waiting EventsAfter (used at shutdown).
  void WakeWatchers();

 private:
  Store(sqlite3* db, size_t history_size) : db_(db), history_size_(history_size) {}
  Status Load();
  StatusOr<ObjectPtr> Write(WatchEvent::Type type, const ObjectKey& key,
                            std::optional<nlohmann::json> object,
                            const std::optional<int64_t>& expected_version);

  sqlite3* db_;
  size_t history_size_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  int64_t version_ = 0;    // guarded by mu_
  int64_t compacted_ = 0;  // newest version no longer in history_
  std::map<ObjectKey, ObjectPtr> objects_;
  std::deque<WatchEvent> history_;
  int64_t writes_since_trim_ = 0;
  bool woken_ = false;
};

}  // namespace tidal::local
