// kube/events.cc
#include "kube/events.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/log.h"
#include "kube/meta_time.h"
#include "kube/request.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

// events.k8s.io/v1 limits `note` to 1 kB; core/v1 has no limit, but a longer message is a log,
// not an Event.
constexpr size_t kMaxMessageBytes = 1024;
constexpr size_t kMaxReasonLength = 128;
constexpr const char* kCombinedPrefix = "(combined from similar events): ";

std::string Truncate(const std::string& message) {
  if (message.size() <= kMaxMessageBytes) return message;
  size_t cut = kMaxMessageBytes;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
  return message.substr(0, cut);
}

std::string Join(std::initializer_list<const std::string*> parts) {
  std::string out;
  for (const std::string* p : parts) {
    out += *p;
    out.push_back('\x1f');  // unit separator: no field can run into the next
  }
  return out;
}

std::string StringAt(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

ObjectReference ObjectReference::For(const json& object) {
  ObjectReference ref;
  if (!object.is_object()) return ref;
  ref.api_version = StringAt(object, "apiVersion");
  ref.kind = StringAt(object, "kind");
  auto meta = object.find("metadata");
  if (meta != object.end() && meta->is_object()) {
    ref.namespace_ = StringAt(*meta, "namespace");
    ref.name = StringAt(*meta, "name");
    ref.uid = StringAt(*meta, "uid");
    ref.resource_version = StringAt(*meta, "resourceVersion");
  }
  return ref;
}

json ObjectReference::ToJson() const {
  json j = json::object();
  auto put = [&](const char* key, const std::string& v) {
    if (!v.empty()) j[key] = v;
  };
  put("apiVersion", api_version);
  put("kind", kind);
  put("namespace", namespace_);
  put("name", name);
  put("uid", uid);
  put("resourceVersion", resource_version);
  put("fieldPath", field_path);
  return j;
}

Status ValidateEvent(const EventRecord& r) {
  if (r.type != kEventTypeNormal && r.type != kEventTypeWarning)
    return InvalidArgument("event type \"" + r.type + "\": expected Normal or Warning");
  bool camel = !r.reason.empty() && r.reason.size() <= kMaxReasonLength &&
               std::isupper(static_cast<unsigned char>(r.reason[0])) &&
               std::all_of(r.reason.begin(), r.reason.end(),
                           [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  if (!camel)
    return InvalidArgument("event reason \"" + r.reason +
                           "\": expected CamelCase ([A-Z][A-Za-z0-9]*, at most 128)");
  if (r.involved.name.empty() || r.involved.kind.empty())
    return InvalidArgument("event involvedObject: kind and name are required");
  return OkStatus();
}

template <typename V>
V* EventCorrelator::Lru<V>::Find(const std::string& text) {
  auto it = at_.find(HashOf(text));
  if (it == at_.end()) return nullptr;
  items_.splice(items_.begin(), items_, it->second);  // now the most recent
  return &it->second->second;
}

template <typename V>
V& EventCorrelator::Lru<V>::Put(const std::string& text, V value) {
  const uint64_t key = HashOf(text);
  auto it = at_.find(key);
  if (it != at_.end()) {
    items_.erase(it->second);
    at_.erase(it);
  }
  items_.emplace_front(key, std::move(value));
  at_[key] = items_.begin();
  while (items_.size() > std::max<size_t>(capacity_, 1)) {
    at_.erase(items_.back().first);
    items_.pop_back();
  }
  return items_.front().second;
}

EventCorrelator::EventCorrelator(EventSource source, CorrelatorOptions options)
    : source_(std::move(source)),
      options_(options),
      posted_(options.cache_size),
      similar_(options.cache_size),
      spam_(options.cache_size) {}

std::string EventCorrelator::DedupKey(const EventRecord& r) const {
  const ObjectReference& o = r.involved;
  return Join({&source_.component, &source_.host, &o.kind, &o.namespace_, &o.name, &o.field_path,
               &o.uid, &o.api_version, &r.type, &r.reason, &r.message});
}

std::string EventCorrelator::AggregateKey(const EventRecord& r) const {
  const ObjectReference& o = r.involved;
  return Join({&source_.component, &source_.host, &o.kind, &o.namespace_, &o.name, &o.field_path,
               &o.uid, &o.api_version, &r.type, &r.reason});
}

std::string EventCorrelator::SpamKey(const EventRecord& r) const {
  const ObjectReference& o = r.involved;
  return Join(
      {&source_.component, &source_.host, &o.kind, &o.namespace_, &o.name, &o.uid, &o.api_version});
}

std::string EventCorrelator::NewName(const EventRecord& r) {
  // As client-go: "<name>.<unix nanoseconds in hex>", made strictly increasing here so two
  // events of one process never collide.
  int64_t nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(r.timestamp.time_since_epoch()).count();
  nanos = std::max(nanos, last_name_nanos_ + 1);
  last_name_nanos_ = nanos;
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(nanos));
  std::string base = r.involved.name.substr(0, 253 - 1 - std::string(hex).size());
  while (!base.empty() && !std::isalnum(static_cast<unsigned char>(base.back()))) base.pop_back();
  return base + "." + hex;
}

CorrelatedEvent EventCorrelator::Correlate(const EventRecord& r) {
  // 1. Aggregate: the Nth distinct message for one object and reason within the window turns
  //    into one combined Event (client-go EventAggregator).
  const std::string dedup_key = DedupKey(r);
  std::string key = dedup_key;
  std::string message = r.message;
  const std::string aggregate_key = AggregateKey(r);
  Similar* similar = similar_.Find(aggregate_key);
  if (!similar || r.seen - similar->last_seen > options_.window)
    similar = &similar_.Put(aggregate_key, Similar{{}, r.seen});
  similar->last_seen = r.seen;
  similar->dedup_keys.insert(HashOf(dedup_key));
  if (options_.aggregate_max_events > 0 &&
      similar->dedup_keys.size() >= static_cast<size_t>(options_.aggregate_max_events)) {
    similar->dedup_keys.erase(similar->dedup_keys.begin());  // stay bounded, as client-go
    key = aggregate_key;
    message = kCombinedPrefix + r.message;
  }

  // 2. Observe: a repeat within the window counts on the Event already posted.
  CorrelatedEvent out;
  out.namespace_ = r.involved.namespace_.empty() ? "default" : r.involved.namespace_;
  Posted* posted = posted_.Find(key);
  const std::string now = FormatTime(r.timestamp);
  if (!posted || r.seen - posted->last_seen > options_.window) {
    posted = &posted_.Put(key, Posted{NewName(r), 1, now, r.seen});
    out.action = CorrelatedEvent::kCreate;
  } else {
    ++posted->count;
    posted->last_seen = r.seen;
    out.action = CorrelatedEvent::kPatch;
  }
  out.name = posted->name;
  json source = {{"component", source_.component}};
  if (!source_.host.empty()) source["host"] = source_.host;
  out.event = {{"apiVersion", "v1"},
               {"kind", "Event"},
               {"metadata", {{"name", out.name}, {"namespace", out.namespace_}}},
               {"involvedObject", r.involved.ToJson()},
               {"type", r.type},
               {"reason", r.reason},
               {"message", message},
               {"source", source},
               {"firstTimestamp", posted->first_timestamp},
               {"lastTimestamp", now},
               {"count", posted->count},
               {"reportingComponent", source_.component},
               {"reportingInstance", source_.host}};
  out.patch = {{"count", posted->count}, {"lastTimestamp", now}, {"message", message}};

  // 3. Spam filter: a token bucket per source and object (client-go
  //    EventSourceObjectSpamFilter). The count above still includes what it drops.
  if (options_.spam_burst > 0 && !options_.unfiltered_reasons.count(r.reason)) {
    const Clock::Duration interval = options_.spam_refill_interval;
    const std::string spam_key = SpamKey(r);
    Bucket* bucket = spam_.Find(spam_key);
    Clock::TimePoint tat =
        std::max(bucket ? bucket->theoretical_arrival : r.seen, r.seen) + interval;
    if (tat - r.seen > interval * options_.spam_burst) {
      out.action = CorrelatedEvent::kSkip;
    } else if (bucket) {
      bucket->theoretical_arrival = tat;
    } else {
      spam_.Put(spam_key, Bucket{tat});
    }
  }
  return out;
}

Status KubeEventSink::Create(const std::string& ns, const json& event) {
  TIDAL_ASSIGN_OR_RETURN(Request request, CreateRequest(Resource::Events(), ns, event));
  return client_.Call(request).status();
}

Status KubeEventSink::Patch(const std::string& ns, const std::string& name, const json& patch) {
  TIDAL_ASSIGN_OR_RETURN(Request request, MergePatchRequest(Resource::Events(), ns, name, patch));
  return client_.Call(request).status();
}

EventRecorder::EventRecorder(std::shared_ptr<EventSink> sink, EventRecorderOptions options,
                             std::shared_ptr<Clock> clock)
    : sink_(std::move(sink)),
      options_(std::move(options)),
      clock_(std::move(clock)),
      correlator_(options_.source, options_.correlator) {
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::EventRecorder(KubeClient& client, EventRecorderOptions options,
                             std::shared_ptr<Clock> clock)
    : EventRecorder(std::make_shared<KubeEventSink>(client), std::move(options), std::move(clock)) {
}

EventRecorder::~EventRecorder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    shutdown_deadline_ = clock_->Now() + options_.shutdown_timeout;
    wake_.notify_all();
  }
  thread_.join();
}

void EventRecorder::Record(const ObjectReference& involved, const std::string& type,
                           const std::string& reason, const std::string& message) {
  EventRecord record{involved, type, reason, Truncate(message), clock_->WallNow(), clock_->Now()};
  Status valid = ValidateEvent(record);
  std::lock_guard<std::mutex> lock(mu_);
  if (!valid.ok()) {
    ++stats_.invalid;
    LogError("event refused",
             {{"error", valid.message()}, {"object", involved.namespace_ + "/" + involved.name}});
    return;
  }
  if (shutting_down_ || queue_.size() >= options_.queue_capacity) {
    // Log the first drop and then every 100th: a flood of drops must not flood the log too.
    if (stats_.dropped++ % 100 == 0)
      LogWarn(
          "event dropped: the queue is full",
          {{"reason", reason}, {"dropped", stats_.dropped}, {"capacity", options_.queue_capacity}});
    return;
  }
  queue_.push_back(std::move(record));
  ++stats_.recorded;
  wake_.notify_one();
}

bool EventRecorder::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, timeout, [&] { return queue_.empty() && !in_flight_; });
}

EventRecorder::Stats EventRecorder::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool EventRecorder::Backoff(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::TimePoint end = clock_->Now() + d;
  while (clock_->Now() < end) {
    if (shutting_down_ && end > shutdown_deadline_) return false;
    clock_->WaitUntil(wake_, lock, end);
  }
  return true;
}

Status EventRecorder::Send(const CorrelatedEvent& e) {
  Status status;
  auto backoff = options_.retry_backoff;
  for (int attempt = 1; attempt <= std::max(options_.max_attempts, 1); ++attempt) {
    bool creating = e.action == CorrelatedEvent::kCreate;
    if (!creating) {
      status = sink_->Patch(e.namespace_, e.name, e.patch);
      // Gone (expired by the server's TTL, or its create failed): post it whole again.
      if (status.code() == StatusCode::kNotFound) creating = true;
    }
    if (creating) {
      status = sink_->Create(e.namespace_, e.event);
      // A retried create whose first try did land (its answer was lost): done.
      if (status.code() == StatusCode::kAlreadyExists && attempt > 1) status = OkStatus();
    }
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++(creating ? stats_.created : stats_.patched);
      return status;
    }
    // A create refused as existing (409) is a name collision: retrying cannot help.
    if (!status.retryable() || (creating && status.code() == StatusCode::kAlreadyExists)) break;
    if (attempt >= options_.max_attempts || !Backoff(backoff)) break;
    backoff *= 2;
  }
  return status;
}

void EventRecorder::Run() {
  for (;;) {
    EventRecord record;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
      if (queue_.empty()) break;
      if (shutting_down_ && clock_->Now() >= shutdown_deadline_) {
        stats_.dropped += queue_.size();
        LogWarn("events dropped at shutdown", {{"dropped", queue_.size()}});
        queue_.clear();
        break;
      }
      record = std::move(queue_.front());
      queue_.pop_front();
      in_flight_ = true;
    }
    CorrelatedEvent event = correlator_.Correlate(record);
    Status status = OkStatus();
    if (event.action != CorrelatedEvent::kSkip) status = Send(event);
    std::lock_guard<std::mutex> lock(mu_);
    if (event.action == CorrelatedEvent::kSkip) ++stats_.skipped;
    if (!status.ok()) {
      ++stats_.failed;
      LogWarn("event not posted", {{"event", event.namespace_ + "/" + event.name},
                                   {"reason", record.reason},
                                   {"error", status.ToString()}});
    }
    in_flight_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ = false;
  idle_.notify_all();
}

}  // namespace tidal::kube
