// The event correlator against client-go's EventCorrelator (dedup by key within a window into
// count/lastTimestamp patches, aggregation of similar messages, the per-object spam filter, LRU
// bounds), and the recorder's queue, retries and fallbacks against a fake sink.
#include "kube/events.h"

#include <gtest/gtest.h>

#include <future>

#include "kube/meta_time.h"

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const Clock::TimePoint kT0 = Clock::TimePoint(1000h);
const Clock::WallTime kWall0 = Clock::WallTime(1700000000s);

ObjectReference Job(const std::string& name = "llama", const std::string& uid = "uid-1") {
  return {"tidal.dev/v1alpha1", "TrainingJob", "ml", name, uid, "7", ""};
}

EventRecord At(Clock::Duration after, const std::string& message = "scaled to 8 GPUs",
               const std::string& reason = "Scaled", ObjectReference involved = Job(),
               const std::string& type = "Normal") {
  return {involved,
          type,
          reason,
          message,
          kWall0 + std::chrono::duration_cast<Clock::WallTime::duration>(after),
          kT0 + after};
}

CorrelatorOptions NoSpamFilter() {
  CorrelatorOptions o;
  o.spam_burst = 0;
  return o;
}

TEST(EventCorrelator, RepeatsPatchCountAndLastTimestampOfOneEvent) {
  EventCorrelator c({"tidal-operator", "pod-a"});
  CorrelatedEvent first = c.Correlate(At(0s));
  ASSERT_EQ(first.action, CorrelatedEvent::kCreate);
  EXPECT_EQ(first.namespace_, "ml");
  EXPECT_EQ(first.name.rfind("llama.", 0), 0u) << first.name;
  EXPECT_EQ(first.event["metadata"]["name"], first.name);
  EXPECT_EQ(first.event["count"], 1);
  EXPECT_EQ(first.event["type"], "Normal");
  EXPECT_EQ(first.event["reason"], "Scaled");
  EXPECT_EQ(first.event["source"], (json{{"component", "tidal-operator"}, {"host", "pod-a"}}));
  EXPECT_EQ(first.event["involvedObject"]["uid"], "uid-1");
  EXPECT_EQ(first.event["involvedObject"]["kind"], "TrainingJob");
  EXPECT_EQ(first.event["firstTimestamp"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(first.event["lastTimestamp"], "2023-11-14T22:13:20Z");
  for (int i = 2; i <= 5; ++i) {
    CorrelatedEvent again = c.Correlate(At(std::chrono::seconds(i)));
    ASSERT_EQ(again.action, CorrelatedEvent::kPatch) << i;
    EXPECT_EQ(again.name, first.name);
    EXPECT_EQ(again.patch["count"], i);
    EXPECT_EQ(again.patch["lastTimestamp"], FormatTime(kWall0 + std::chrono::seconds(i)));
    EXPECT_EQ(again.event["firstTimestamp"], "2023-11-14T22:13:20Z") << "first stays first";
  }
}

TEST(EventCorrelator, NameIsObjectNameDotHexNanosAndUnique) {
  EventCorrelator c({"tidal-operator", ""}, NoSpamFilter());
  CorrelatedEvent a = c.Correlate(At(0s, "a"));
  CorrelatedEvent b = c.Correlate(At(0s, "b"));  // same nanosecond
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%llx", 1700000000000000000ull);
  EXPECT_EQ(a.name, std::string("llama.") + hex);
  EXPECT_NE(a.name, b.name);
  EXPECT_FALSE(a.event["source"].contains("host")) << "no host given: none written";
}

TEST(EventCorrelator, AnyDifferenceInTheKeyMakesANewEvent) {
  EventCorrelator c({"tidal-operator", "pod-a"}, NoSpamFilter());
  const std::string name = c.Correlate(At(0s)).name;
  for (const EventRecord& other :
       {At(1s, "scaled to 16 GPUs"), At(1s, "scaled to 8 GPUs", "Rescaled"),
        At(1s, "scaled to 8 GPUs", "Scaled", Job("other")),
        At(1s, "scaled to 8 GPUs", "Scaled", Job("llama", "uid-2")),
        At(1s, "scaled to 8 GPUs", "Scaled", Job(), "Warning")}) {
    CorrelatedEvent e = c.Correlate(other);
    EXPECT_EQ(e.action, CorrelatedEvent::kCreate) << c.DedupKey(other);
    EXPECT_NE(e.name, name);
  }
  EventCorrelator other_component({"someone-else", "pod-a"}, NoSpamFilter());
  EXPECT_NE(other_component.DedupKey(At(0s)), c.DedupKey(At(0s)));
  EXPECT_EQ(c.Correlate(At(2s)).action, CorrelatedEvent::kPatch) << "the original still counts";
}

TEST(EventCorrelator, ARepeatAfterTheWindowStartsANewEvent) {
  EventCorrelator c({"tidal-operator", ""}, NoSpamFilter());
  const std::string name = c.Correlate(At(0s)).name;
  EXPECT_EQ(c.Correlate(At(600s)).action, CorrelatedEvent::kPatch) << "within 10 minutes";
  CorrelatedEvent later = c.Correlate(At(1201s));
  EXPECT_EQ(later.action, CorrelatedEvent::kCreate);
  EXPECT_NE(later.name, name);
  EXPECT_EQ(later.event["count"], 1);
}

TEST(EventCorrelator, TenDistinctMessagesForOneReasonAreCombined) {
  EventCorrelator c({"tidal-operator", ""}, NoSpamFilter());
  for (int i = 0; i < 9; ++i) {
    CorrelatedEvent e = c.Correlate(At(std::chrono::seconds(i), "pod " + std::to_string(i)));
    ASSERT_EQ(e.action, CorrelatedEvent::kCreate) << i;
    EXPECT_EQ(e.event["message"], "pod " + std::to_string(i));
  }
  CorrelatedEvent tenth = c.Correlate(At(10s, "pod 9"));
  ASSERT_EQ(tenth.action, CorrelatedEvent::kCreate);
  EXPECT_EQ(tenth.event["message"], "(combined from similar events): pod 9");
  CorrelatedEvent eleventh = c.Correlate(At(11s, "pod 10"));
  ASSERT_EQ(eleventh.action, CorrelatedEvent::kPatch);
  EXPECT_EQ(eleventh.name, tenth.name);
  EXPECT_EQ(eleventh.patch["count"], 2);
  EXPECT_EQ(eleventh.patch["message"], "(combined from similar events): pod 10");
  // Another reason is aggregated separately.
  EXPECT_EQ(c.Correlate(At(12s, "pod 10", "Failed")).event["message"], "pod 10");
}

TEST(EventCorrelator, SpamFilterAllowsABurstOf25PerObjectThenOnePerFiveMinutes) {
  EventCorrelator c({"tidal-operator", ""});
  int sent = 0;
  for (int i = 0; i < 30; ++i)
    if (c.Correlate(At(std::chrono::milliseconds(i), "m" + std::to_string(i % 3))).action !=
        CorrelatedEvent::kSkip)
      ++sent;
  EXPECT_EQ(sent, 25);
  EXPECT_EQ(c.Correlate(At(100ms, "m0", "Scaled", Job("another-object"))).action,
            CorrelatedEvent::kCreate)
      << "the bucket is per object";
  EXPECT_EQ(c.Correlate(At(299s, "m0")).action, CorrelatedEvent::kSkip);
  CorrelatedEvent refilled = c.Correlate(At(301s, "m0"));
  EXPECT_EQ(refilled.action, CorrelatedEvent::kPatch);
  EXPECT_EQ(refilled.patch["count"], 12) << "m0 occurred 10 + 2 times, dropped ones included";
  EXPECT_EQ(c.Correlate(At(302s, "m0")).action, CorrelatedEvent::kSkip);
}

// The operator's once-only reasons (manager.cc: Succeeded, ...) pass an exhausted bucket and
// take nothing from it.
TEST(EventCorrelator, UnfilteredReasonsPassAnExhaustedSpamFilter) {
  CorrelatorOptions o;
  o.unfiltered_reasons = {"Succeeded"};
  EventCorrelator c({"tidal-operator", ""}, o);
  for (int i = 0; i < 30; ++i)
    c.Correlate(At(std::chrono::milliseconds(i), "m" + std::to_string(i)));
  EXPECT_EQ(c.Correlate(At(100ms, "m40")).action, CorrelatedEvent::kSkip) << "the bucket is empty";
  EXPECT_EQ(c.Correlate(At(100ms, "trained to step 540", "Succeeded")).action,
            CorrelatedEvent::kCreate);
  EXPECT_NE(c.Correlate(At(301s, "m41")).action, CorrelatedEvent::kSkip)
      << "the Succeeded took no token: the one refilled is there";
}

TEST(EventCorrelator, CachesAreBoundedLru) {
  CorrelatorOptions o = NoSpamFilter();
  o.cache_size = 2;
  EventCorrelator c({"tidal-operator", ""}, o);
  c.Correlate(At(0s, "a", "A"));
  c.Correlate(At(0s, "b", "B"));
  EXPECT_EQ(c.Correlate(At(1s, "a", "A")).action, CorrelatedEvent::kPatch);  // a is recent now
  c.Correlate(At(2s, "c", "C"));                                             // evicts b
  EXPECT_EQ(c.Correlate(At(3s, "a", "A")).action, CorrelatedEvent::kPatch);
  EXPECT_EQ(c.Correlate(At(4s, "b", "B")).action, CorrelatedEvent::kCreate);
}

TEST(ValidateEvent, TypeReasonAndObject) {
  EXPECT_TRUE(ValidateEvent(At(0s)).ok());
  EXPECT_TRUE(ValidateEvent(At(0s, "m", "Scaled", Job(), "Warning")).ok());
  EXPECT_FALSE(ValidateEvent(At(0s, "m", "Scaled", Job(), "Error")).ok());
  for (const char* bad : {"", "scaled", "Scaled Up", "Scaled_Up", "Scaled-Up"})
    EXPECT_FALSE(ValidateEvent(At(0s, "m", bad)).ok()) << bad;
  EXPECT_FALSE(ValidateEvent(At(0s, "m", std::string(129, 'A'))).ok());
  EXPECT_FALSE(ValidateEvent(At(0s, "m", "Scaled", ObjectReference{})).ok());
}

TEST(ObjectReference, FromAnObject) {
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"namespace", "ml"}, {"name", "w-0"}, {"uid", "u"}, {"resourceVersion", "9"}}}};
  ObjectReference ref = ObjectReference::For(pod);
  EXPECT_EQ(ref, (ObjectReference{"v1", "Pod", "ml", "w-0", "u", "9", ""}));
  EXPECT_EQ(ref.ToJson(), (json{{"apiVersion", "v1"},
                                {"kind", "Pod"},
                                {"namespace", "ml"},
                                {"name", "w-0"},
                                {"uid", "u"},
                                {"resourceVersion", "9"}}));
}

// Records what was sent; can hold the sender in Create/Patch, or fail a number of times.
class FakeSink final : public EventSink {
 public:
  Status Create(const std::string& ns, const json& event) override {
    return Call("create " + ns + "/" + event["metadata"]["name"].get<std::string>() + " " +
                std::to_string(event["count"].get<int>()));
  }
  Status Patch(const std::string& ns, const std::string& name, const json& patch) override {
    std::string call = "patch " + ns + "/" + name + " " + std::to_string(patch["count"].get<int>());
    {
      std::lock_guard<std::mutex> lock(mu);
      if (patch_not_found) {
        calls.push_back(call);
        return NotFound("events \"" + name + "\" not found");
      }
    }
    return Call(call);
  }
  Status Call(const std::string& call) {
    std::unique_lock<std::mutex> lock(mu);
    calls.push_back(call);
    entered.notify_all();
    released.wait(lock, [&] { return !hold; });
    if (failures > 0) {
      --failures;
      return failure;
    }
    return OkStatus();
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    hold = false;
    released.notify_all();
  }
  bool WaitEntered(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return entered.wait_for(lock, 10s, [&] { return calls.size() >= n; });
  }
  std::vector<std::string> Calls() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }

  std::mutex mu;
  std::condition_variable entered, released;
  std::vector<std::string> calls;
  bool hold = false;
  bool patch_not_found = false;
  int failures = 0;
  Status failure = Unavailable("apiserver down");
};

EventRecorderOptions Options() {
  EventRecorderOptions o;
  o.source = {"tidal-operator", "pod-a"};
  o.retry_backoff = 1ms;
  return o;
}

json JobObject() {
  return {{"apiVersion", "tidal.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"namespace", "ml"}, {"name", "llama"}, {"uid", "uid-1"}}}};
}

TEST(EventRecorder, FiveIdenticalEventsAreOneCreateAndFourPatches) {
  auto sink = std::make_shared<FakeSink>();
  EventRecorder recorder(sink, Options());
  for (int i = 0; i < 5; ++i) recorder.Normal(JobObject(), "Scaled", "scaled to 8 GPUs");
  ASSERT_TRUE(recorder.Flush(10s));
  auto calls = sink->Calls();
  ASSERT_EQ(calls.size(), 5u) << ::testing::PrintToString(calls);
  std::string name = calls[0].substr(7, calls[0].rfind(' ') - 7);
  EXPECT_EQ(calls[0], "create " + name + " 1");
  for (int i = 2; i <= 5; ++i) EXPECT_EQ(calls[i - 1], "patch " + name + " " + std::to_string(i));
  auto stats = recorder.stats();
  EXPECT_EQ(stats.recorded, 5u);
  EXPECT_EQ(stats.created, 1u);
  EXPECT_EQ(stats.patched, 4u);
  EXPECT_EQ(stats.failed, 0u);
}

TEST(EventRecorder, APatchThatFindsTheEventGoneCreatesItWithTheCount) {
  auto sink = std::make_shared<FakeSink>();
  EventRecorder recorder(sink, Options());
  recorder.Warning(JobObject(), "BackOff", "restarting");
  ASSERT_TRUE(recorder.Flush(10s));
  sink->patch_not_found = true;
  recorder.Warning(JobObject(), "BackOff", "restarting");
  ASSERT_TRUE(recorder.Flush(10s));
  auto calls = sink->Calls();
  ASSERT_EQ(calls.size(), 3u) << ::testing::PrintToString(calls);
  EXPECT_EQ(calls[1].substr(0, 6), "patch ");
  EXPECT_EQ(calls[2], "create" + calls[1].substr(5)) << "same name, count 2";
  EXPECT_EQ(recorder.stats().created, 2u);
}

TEST(EventRecorder, RetriesRetryableFailuresThenGivesUpAndCounts) {
  auto sink = std::make_shared<FakeSink>();
  sink->failures = 2;
  EventRecorder recorder(sink, Options());
  recorder.Normal(JobObject(), "Scaled", "a");
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_EQ(sink->Calls().size(), 3u) << "two failures, then success";
  EXPECT_EQ(recorder.stats().created, 1u);
  EXPECT_EQ(recorder.stats().failed, 0u);

  sink->failures = 100;
  recorder.Normal(JobObject(), "Scaled", "b");
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_EQ(sink->Calls().size(), 6u) << "max_attempts = 3";
  EXPECT_EQ(recorder.stats().failed, 1u);

  sink->failures = 1;
  sink->failure = InvalidArgument("bad event");
  recorder.Normal(JobObject(), "Scaled", "c");
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_EQ(sink->Calls().size(), 7u) << "a terminal error is not retried";
  EXPECT_EQ(recorder.stats().failed, 2u);
}

TEST(EventRecorder, RecordNeverBlocksAndAFullQueueDrops) {
  auto sink = std::make_shared<FakeSink>();
  sink->hold = true;
  EventRecorderOptions o = Options();
  o.queue_capacity = 2;
  EventRecorder recorder(sink, o);
  recorder.Normal(JobObject(), "Scaled", "m0");
  ASSERT_TRUE(sink->WaitEntered(1));  // the sender is stuck in the API call
  auto recording = std::async(std::launch::async, [&] {
    for (int i = 1; i < 10; ++i) recorder.Normal(JobObject(), "Scaled", "m" + std::to_string(i));
  });
  ASSERT_EQ(recording.wait_for(10s), std::future_status::ready) << "Record blocked";
  auto stats = recorder.stats();
  EXPECT_EQ(stats.recorded, 3u);  // one in flight + two queued
  EXPECT_EQ(stats.dropped, 7u);
  sink->Release();
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_EQ(sink->Calls().size(), 3u);
}

TEST(EventRecorder, InvalidEventsAreRefusedNotSent) {
  auto sink = std::make_shared<FakeSink>();
  EventRecorder recorder(sink, Options());
  recorder.Record(JobObject(), "Error", "Scaled", "m");
  recorder.Record(JobObject(), "Normal", "not camel", "m");
  recorder.Record(json::object(), "Normal", "Scaled", "m");
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_TRUE(sink->Calls().empty());
  EXPECT_EQ(recorder.stats().invalid, 3u);
}

TEST(EventRecorder, LongMessagesAreTruncatedOnACharacterBoundary) {
  class Capture final : public EventSink {
   public:
    Status Create(const std::string&, const json& event) override {
      message = event["message"];
      return OkStatus();
    }
    Status Patch(const std::string&, const std::string&, const json&) override {
      return OkStatus();
    }
    std::string message;
  };
  auto sink = std::make_shared<Capture>();
  EventRecorder recorder(sink, Options());
  std::string text;
  for (int i = 0; i < 600; ++i) text += "é";  // 2 bytes each
  recorder.Normal(JobObject(), "Scaled", "x" + text);
  ASSERT_TRUE(recorder.Flush(10s));
  EXPECT_EQ(sink->message.size(), 1023u) << "1024 would split an é";
  EXPECT_EQ(sink->message.substr(0, 3), "xé");
}

TEST(EventRecorder, DestructionSendsWhatIsQueued) {
  auto sink = std::make_shared<FakeSink>();
  {
    EventRecorder recorder(sink, Options());
    for (int i = 0; i < 3; ++i) recorder.Normal(JobObject(), "Scaled", "m" + std::to_string(i));
  }
  EXPECT_EQ(sink->Calls().size(), 3u);
}

}  // namespace
}  // namespace tidal::kube
