// kube/watcher.cc
#include "kube/watcher.h"

#include <set>

#include "common/log.h"

namespace tidal::kube {
namespace {

std::string KeyOf(const nlohmann::json& object) {
  const auto& m = object.value("metadata", nlohmann::json::object());
  return m.value("namespace", "") + "/" + m.value("name", "");
}

// Opaque (API conventions: "clients must not assume resource versions are numeric or
// collatable"): compared for equality only.
std::string VersionOf(const nlohmann::json& object) {
  auto md = object.find("metadata");
  if (md == object.end() || !md->is_object()) return "";
  auto rv = md->find("resourceVersion");
  return rv != md->end() && rv->is_string() ? rv->get<std::string>() : "";
}

}  // namespace

const char* WatcherStateName(WatcherState state) {
  switch (state) {
    case WatcherState::kInitial:
      return "Initial";
    case WatcherState::kListed:
      return "Listed";
    case WatcherState::kWatching:
      return "Watching";
  }
  return "Unknown";
}

nlohmann::json WatcherCore::LastKnown(const std::string& key, const Known& known) const {
  if (keep_objects_) return known.object;
  size_t slash = key.find('/');  // namespaces never contain '/'
  nlohmann::json meta = {{"name", key.substr(slash + 1)}, {"resourceVersion", known.version}};
  if (slash > 0) meta["namespace"] = key.substr(0, slash);
  return {{"metadata", std::move(meta)}};
}

std::vector<ObjectEvent> WatcherCore::OnList(const nlohmann::json& list) {
  std::vector<ObjectEvent> out;
  std::map<std::string, Known> next;
  std::map<std::string, const nlohmann::json*> items;
  if (list.contains("items") && list["items"].is_array())
    for (const auto& item : list["items"]) {
      std::string key = KeyOf(item);
      next[key] = Known{VersionOf(item), keep_objects_ ? item : nlohmann::json()};
      items[key] = &item;
    }
  for (const auto& [key, was] : known_)
    if (!next.count(key)) out.push_back({ObjectEvent::kDeleted, LastKnown(key, was)});
  for (const auto& [key, now] : next) {
    auto it = known_.find(key);
    if (it == known_.end()) {
      out.push_back({ObjectEvent::kAdded, *items[key]});
    } else if (it->second.version != now.version) {
      out.push_back({ObjectEvent::kModified, *items[key]});
    }
  }
  known_ = std::move(next);
  resource_version_ = list.value("metadata", nlohmann::json::object()).value("resourceVersion", "");
  state_ = WatcherState::kListed;
  return out;
}

void WatcherCore::OnWatchOpened() {
  if (state_ == WatcherState::kListed) state_ = WatcherState::kWatching;
}

std::vector<ObjectEvent> WatcherCore::OnEvent(const WatchEventJson& event) {
  std::vector<ObjectEvent> out;
  if (state_ != WatcherState::kWatching) return out;
  std::string version = VersionOf(event.object);
  if (!version.empty()) resource_version_ = version;
  if (event.type == "BOOKMARK") return out;
  std::string key = KeyOf(event.object);
  auto it = known_.find(key);
  if (event.type == "DELETED") {
    if (it != known_.end()) {
      known_.erase(it);
      out.push_back({ObjectEvent::kDeleted, event.object});
    }
    return out;
  }
  if (event.type != "ADDED" && event.type != "MODIFIED") return out;
  // The version delivered last, again (a resumed watch replays from its resourceVersion on).
  // Versions are not ordered: any other one is news, as the server sends it.
  if (it != known_.end() && it->second.version == version) return out;
  out.push_back({it == known_.end() ? ObjectEvent::kAdded : ObjectEvent::kModified, event.object});
  known_[key] = Known{std::move(version), keep_objects_ ? event.object : nlohmann::json()};
  return out;
}

void WatcherCore::OnWatchEnded() {
  if (state_ == WatcherState::kWatching) state_ = WatcherState::kListed;
}

void WatcherCore::OnExpired() { state_ = WatcherState::kInitial; }

Watcher::Watcher(KubeClient& client, WatcherOptions options, Callback callback, WatcherCore core)
    : client_(client),
      options_(std::move(options)),
      callback_(std::move(callback)),
      core_(std::move(core)) {
  thread_ = std::thread([this] { Run(); });
}

Watcher::~Watcher() { Stop(); }

void Watcher::Stop() {
  if (!stop_.exchange(true)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_) stream_->Cancel();
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

WatcherCore Watcher::core() const {
  std::lock_guard<std::mutex> lock(mu_);
  return core_;
}

void Watcher::Sleep(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_.wait_for(lock, d, [&] { return stop_.load(); });
}

void Watcher::Run() {
  auto backoff = options_.initial_backoff;
  auto fail = [&](const Status& s, const char* during) {
    Logger::Get().Log("warn", "watch interrupted",
                      {{"resource", options_.resource.plural},
                       {"during", during},
                       {"error", s.message()},
                       {"retry_ms", backoff.count()}});
    Sleep(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  };
  auto deliver = [&](const std::vector<ObjectEvent>& events) {
    for (const auto& e : events) callback_(e);
  };
  while (!stop_.load()) {
    WatcherState state;
    std::string rv;
    {
      std::lock_guard<std::mutex> lock(mu_);
      state = core_.state();
      rv = core_.resource_version();
    }
    if (state == WatcherState::kInitial) {
      ListOptions list;
      list.label_selector = options_.label_selector;
      auto request = ListRequest(options_.resource, options_.namespace_, list);
      if (!request.ok()) return;  // a programming error: the options never change
      auto body = client_.Call(*request);
      if (!body.ok()) {
        fail(body.status(), "list");
        continue;
      }
      std::vector<ObjectEvent> events;
      {
        std::lock_guard<std::mutex> lock(mu_);
        events = core_.OnList(*body);
      }
      ++relists_;
      deliver(events);
      if (options_.on_listed) options_.on_listed();
      continue;
    }
    // Listed: (re)open the watch from the last version seen.
    WatchOptions watch;
    watch.resource_version = rv;
    watch.allow_watch_bookmarks = true;
    watch.label_selector = options_.label_selector;
    auto request = WatchRequest(options_.resource, options_.namespace_, watch);
    if (!request.ok()) return;
    auto stream = client_.Watch(*request, options_.idle_timeout);
    if (!stream.ok()) {
      if (stream.status().code() == StatusCode::kExpired) {
        std::lock_guard<std::mutex> lock(mu_);
        core_.OnExpired();
        continue;
      }
      fail(stream.status(), "watch");
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) break;
      stream_ = stream->get();
      core_.OnWatchOpened();
    }
    backoff = options_.initial_backoff;
    Status ended = OkStatus();
    while (!stop_.load()) {
      auto event = (*stream)->Next();
      if (!event.ok()) {
        ended = event.status();
        break;
      }
      if (!*event) break;  // server closed the watch: resume
      std::vector<ObjectEvent> events;
      {
        std::lock_guard<std::mutex> lock(mu_);
        events = core_.OnEvent(**event);
      }
      deliver(events);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = nullptr;
      if (ended.code() == StatusCode::kExpired) {
        core_.OnExpired();
      } else {
        core_.OnWatchEnded();
      }
    }
    if (!ended.ok() && ended.code() != StatusCode::kExpired && !stop_.load()) fail(ended, "stream");
  }
}

}  // namespace tidal::kube
