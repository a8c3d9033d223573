// kube/events.h — recording core/v1 Events about objects, as client-go's
// tools/record EventRecorder with its EventCorrelator:
//  - Record() never blocks a reconcile: it validates, stamps the time and puts the event on a
//    bounded queue (1000, as client-go's broadcaster); a full queue drops it (counted);
//  - one thread correlates and posts. Identical events (same source, involved object, type,
//    reason, message) within a window increment `count` and `lastTimestamp` of the Event
//    already posted, by PATCH, instead of creating another (client-go's eventLogger); when one
//    object gets 10 distinct messages for one reason within the window they are combined into
//    one "(combined from similar events): ..." Event (EventAggregator); a token bucket per
//    source and object (burst 25, one per 5 minutes) drops spam (EventSourceObjectSpamFilter);
//  - Event names are "<object-name>.<hex unix nanoseconds>", as client-go's;
//  - failures are retried a few times when retryable, then logged, never thrown; a PATCH that
//    finds the Event gone (TTL) creates it again.
// EventCorrelator is pure (times come in with the record); EventRecorder is the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "kube/client.h"

namespace tidal::kube {

// core/v1 ObjectReference: the object an Event is about.
struct ObjectReference {
  std::string api_version, kind, namespace_, name, uid, resource_version, field_path;
  // From an object's apiVersion, kind and metadata.
  static ObjectReference For(const nlohmann::json& object);
  nlohmann::json ToJson() const;
  bool operator==(const ObjectReference&) const = default;
};

struct EventSource {
  std::string component;  // e.g. "tidal-operator"
  std::string host;       // e.g. the pod name
};

inline constexpr const char* kEventTypeNormal = "Normal";
inline constexpr const char* kEventTypeWarning = "Warning";

// One occurrence, as Record() captured it.
struct EventRecord {
  ObjectReference involved;
  std::string type, reason, message;
  Clock::WallTime timestamp;  // written into first/lastTimestamp
  Clock::TimePoint seen;      // for windows and rate limits
};

// Type Normal or Warning; reason CamelCase ([A-Z][A-Za-z0-9]*, ≤ 128); an object with a name.
Status ValidateEvent(const EventRecord& record);

struct CorrelatorOptions {
  // client-go's defaults (tools/record/events_cache.go).
  size_t cache_size = 4096;                        // maxLruCacheEntries, per cache
  std::chrono::seconds window{600};                // defaultAggregateIntervalInSeconds
  int aggregate_max_events = 10;                   // defaultAggregateMaxEvents
  int spam_burst = 25;                             // defaultSpamBurst; ≤ 0 disables the filter
  std::chrono::seconds spam_refill_interval{300};  // defaultSpamQPS = 1/300
  // Reasons the spam filter never drops (nor counts): an object's once-only events, such as the
  // one that closes its story, which a busy life (many rescales, recoveries) would otherwise
  // lose. Not in client-go, where every reason shares the bucket.
  std::set<std::string> unfiltered_reasons;
};

// What to send for one record.
struct CorrelatedEvent {
  enum Action { kCreate, kPatch, kSkip } action = kSkip;
  std::string namespace_, name;
  nlohmann::json event;  // the whole Event as it now stands (also the fallback of a patch)
  nlohmann::json patch;  // kPatch: {count, lastTimestamp, message}
};

class EventCorrelator {
 public:
  explicit EventCorrelator(EventSource source, CorrelatorOptions options = {});
  // Not thread-safe: one thread (the recorder's) owns it.
  CorrelatedEvent Correlate(const EventRecord& record);

  // The keys (client-go's getEventKey and EventAggregatorByReasonFunc).
  std::string DedupKey(const EventRecord& record) const;
  std::string AggregateKey(const EventRecord& record) const;
  std::string SpamKey(const EventRecord& record) const;

 private:
  // Keys are kept as 64-bit hashes of the key strings (a key names the object, reason, source
  // and message: hundreds of bytes, held twice, for each of up to 3 × 4,096 entries). Two keys
  // that collide would count as one Event; at 2^-64 a pair, that is never in practice.
  static uint64_t HashOf(const std::string& key) { return std::hash<std::string>{}(key); }
  template <typename V>
  class Lru {
   public:
    explicit Lru(size_t capacity) : capacity_(capacity) {}
    V* Find(const std::string& key);
    V& Put(const std::string& key, V value);

   private:
    size_t capacity_;
    std::list<std::pair<uint64_t, V>> items_;  // most recent first
    std::unordered_map<uint64_t, typename std::list<std::pair<uint64_t, V>>::iterator> at_;
  };
  struct Posted {  // an Event this correlator created
    std::string name;
    int64_t count;
    std::string first_timestamp;
    Clock::TimePoint last_seen;
  };
  struct Similar {
    std::unordered_set<uint64_t> dedup_keys;  // HashOf
    Clock::TimePoint last_seen;
  };
  struct Bucket {
    Clock::TimePoint theoretical_arrival;
  };
  std::string NewName(const EventRecord& record);

  EventSource source_;
  CorrelatorOptions options_;
  Lru<Posted> posted_;
  Lru<Similar> similar_;
  Lru<Bucket> spam_;
  int64_t last_name_nanos_ = 0;
};

// Where Events go: the API server, or a fake in tests.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual Status Create(const std::string& ns, const nlohmann::json& event) = 0;
  virtual Status Patch(const std::string& ns, const std::string& name,
                       const nlohmann::json& patch) = 0;
};

// POST /api/v1/namespaces/NS/events and merge-PATCH .../events/NAME.
class KubeEventSink final : public EventSink {
 public:
  explicit KubeEventSink(KubeClient& client) : client_(client) {}
  Status Create(const std::string& ns, const nlohmann::json& event) override;
  Status Patch(const std::string& ns, const std::string& name,
               const nlohmann::json& patch) override;

 private:
  KubeClient& client_;
};

struct EventRecorderOptions {
  EventSource source;
  size_t queue_capacity = 1000;  // client-go's maxQueuedEvents
  CorrelatorOptions correlator;
  int max_attempts = 3;                          // per send, for retryable failures
  std::chrono::milliseconds retry_backoff{200};  // doubled per attempt
  // On destruction, how long queued events may still take to send; the rest are dropped.
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(5)};
};

class EventRecorder {
 public:
  EventRecorder(std::shared_ptr<EventSink> sink, EventRecorderOptions options,
                std::shared_ptr<Clock> clock = RealClock::Get());
  EventRecorder(KubeClient& client, EventRecorderOptions options,
                std::shared_ptr<Clock> clock = RealClock::Get());
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Never blocks and never fails: an invalid event is logged and counted, a full queue drops.
  void Record(const ObjectReference& involved, const std::string& type, const std::string& reason,
              const std::string& message);
  void Record(const nlohmann::json& object, const std::string& type, const std::string& reason,
              const std::string& message) {
    Record(ObjectReference::For(object), type, reason, message);
  }
  void Normal(const nlohmann::json& object, const std::string& reason, const std::string& message) {
    Record(object, kEventTypeNormal, reason, message);
  }
  void Warning(const nlohmann::json& object, const std::string& reason,
               const std::string& message) {
    Record(object, kEventTypeWarning, reason, message);
  }

  // Waits until everything recorded so far has been sent (or given up); false on timeout.
  bool Flush(std::chrono::milliseconds timeout);

  struct Stats {
    uint64_t recorded = 0;  // accepted onto the queue
    uint64_t created = 0, patched = 0;
    uint64_t skipped = 0;  // by the spam filter
    uint64_t dropped = 0;  // queue full, or still queued at shutdown
    uint64_t invalid = 0;  // refused by ValidateEvent
    uint64_t failed = 0;   // sends given up after retries
  };
  Stats stats() const;

 private:
  void Run();
  Status Send(const CorrelatedEvent& event);
  // Sleeps up to `d` unless shutting down; false if shutting down.
  bool Backoff(std::chrono::milliseconds d);

  const std::shared_ptr<EventSink> sink_;
  const EventRecorderOptions options_;
  const std::shared_ptr<Clock> clock_;
  EventCorrelator correlator_;  // the sender thread's alone

  mutable std::mutex mu_;
  std::condition_variable wake_;  // queue non-empty, or shutdown
  std::condition_variable idle_;  // queue empty and nothing in flight
  std::deque<EventRecord> queue_;
  bool in_flight_ = false;
  bool shutting_down_ = false;
  Clock::TimePoint shutdown_deadline_{};
  Stats stats_;
  std::thread thread_;
};

}  // namespace tidal::kube
