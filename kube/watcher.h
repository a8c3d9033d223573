// kube/watcher.h — list-then-watch as an explicit state machine (kube-rs's watcher,
// client-go's reflector): list → watch from the list's resourceVersion → on a dropped stream
// resume from the last version seen (events or bookmarks) → on 410 Gone relist and emit the
// difference against what was known. Events are never duplicated: an object version already
// delivered is not delivered again. WatcherCore is pure (table-tested); Watcher runs it on a
// thread against a KubeClient.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "kube/request.h"

namespace tidal::kube {

enum class WatcherState { kInitial, kListed, kWatching };
const char* WatcherStateName(WatcherState state);

struct ObjectEvent {
  enum Type { kAdded, kModified, kDeleted } type;
  nlohmann::json object;
};

class WatcherCore {
 public:
  WatcherCore() = default;
  // Remembers only each object's version, not the object: for a consumer that keeps the
  // objects itself (the informer's store), so that they are held once. A deletion found by a
  // relist then carries only metadata.namespace, name and resourceVersion.
  static WatcherCore KeepingVersionsOnly() {
    WatcherCore core;
    core.keep_objects_ = false;
    return core;
  }

  WatcherState state() const { return state_; }
  const std::string& resource_version() const { return resource_version_; }
  size_t known_objects() const { return known_.size(); }

  // A list answer: the difference against what was known, in key order.
  std::vector<ObjectEvent> OnList(const nlohmann::json& list);
  void OnWatchOpened();
  // One watch event (ADDED/MODIFIED/DELETED/BOOKMARK): what to deliver, possibly nothing.
  std::vector<ObjectEvent> OnEvent(const WatchEventJson& event);
  // The stream ended or broke: resume from resource_version().
  void OnWatchEnded();
  // 410 Gone: relist.
  void OnExpired();

 private:
  struct Known {
    std::string version;    // opaque: equality only
    nlohmann::json object;  // null when !keep_objects_
  };
  nlohmann::json LastKnown(const std::string& key, const Known& known) const;

  bool keep_objects_ = true;
  WatcherState state_ = WatcherState::kInitial;
  std::string resource_version_;
  std::map<std::string, Known> known_;  // by namespace/name
};

struct WatcherOptions {
  Resource resource;
  std::string namespace_;  // "" for all namespaces
  std::string label_selector;
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{std::chrono::seconds(30)};
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(90)};  // > bookmark interval
  // Called on the watcher's thread once the events of a (re)list have all been delivered:
  // from then on the consumer has seen the complete state (client-go's HasSynced).
  std::function<void()> on_listed;
};

class Watcher {
 public:
  using Callback = std::function<void(const ObjectEvent&)>;
  // Starts a thread delivering events to `callback` (on that thread), starting from `core`.
  Watcher(KubeClient& client, WatcherOptions options, Callback callback, WatcherCore core = {});
  ~Watcher();
  void Stop();
  // Copies of the state, for tests and metrics.
  WatcherCore core() const;
  int relists() const { return relists_.load(); }

 private:
  void Run();
  void Sleep(std::chrono::milliseconds d);

  KubeClient& client_;
  WatcherOptions options_;
  Callback callback_;
  mutable std::mutex mu_;
  WatcherCore core_;
  WatchStream* stream_ = nullptr;  // guarded by mu_, for Stop() to cancel
  std::atomic<bool> stop_{false};
  std::atomic<int> relists_{0};
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace tidal::kube
