// The operator's StatusFeed against a worker's WatchStatus over real gRPC on loopback (a fake
// WorkerControl service pushes what each test says): what the operator acts on wakes the job
// at once, step figures only reach the patcher, a stream that ends wakes the job once and is
// reopened only after its backoff, and a pod no longer followed has its stream closed.
#include "operator/controller/status_feed.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "contract/client.h"
#include "contract/wire.h"
#include "contract/worker_status.h"
#include "tidal/worker/v1/worker.grpc.pb.h"

namespace tidal::controller {
namespace {

namespace pb = ::tidal::worker::v1;
using namespace std::chrono_literals;

class FakeWorker final : public pb::WorkerControl::Service {
 public:
  grpc::Status WatchStatus(grpc::ServerContext* ctx, const pb::WatchStatusRequest* req,
                           grpc::ServerWriter<pb::WorkerStatus>* writer) override {
    auto auth = ctx->client_metadata().find("authorization");
    if (auth == ctx->client_metadata().end() || auth->second != "Bearer secret")
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the job token does not match");
    std::unique_lock<std::mutex> lock(mu_);
    ++calls_;
    min_interval_ms_ = req->min_interval_ms();
    cv_.notify_all();
    while (!ctx->IsCancelled()) {
      cv_.wait_for(lock, 20ms, [&] { return !queue_.empty() || end_; });
      if (end_) {
        end_ = false;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker goes away");
      }
      while (!queue_.empty()) {
        pb::WorkerStatus s = queue_.front();
        queue_.pop_front();
        lock.unlock();
        writer->Write(s);
        lock.lock();
      }
    }
    ++cancelled_;
    cv_.notify_all();
    return grpc::Status::OK;
  }
  void Push(const contract::WorkerStatus& s) {
    pb::WorkerStatus message;
    contract::ToWire(s, &message);
    PushWire(std::move(message));
  }
  void PushWire(pb::WorkerStatus s) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(s));
    cv_.notify_all();
  }
  void EndStream() {
    std::lock_guard<std::mutex> lock(mu_);
    end_ = true;
    cv_.notify_all();
  }
  template <typename F>
  bool WaitFor(F done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 30s, [&] { return done(); });
  }
  int calls_ = 0, cancelled_ = 0;
  int64_t min_interval_ms_ = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<pb::WorkerStatus> queue_;
  bool end_ = false;
};

using api::WorkerPhase;

contract::WorkerStatus Status(WorkerPhase phase, int64_t generation, int rank, int64_t step) {
  contract::WorkerStatus s;
  s.phase = phase;
  s.generation = generation;
  s.rank = rank;
  s.world_size = 2;
  s.step = step;
  s.loss = 2.5 - 0.01 * static_cast<double>(step);
  s.tokens_per_second = 1000;
  return s;
}

template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

class StatusFeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now() + 1s); }
  std::shared_ptr<contract::WorkerApi> Client(const std::string& token = "secret") {
    contract::ClientOptions o;
    o.address = "127.0.0.1:" + std::to_string(port_);
    o.token = token;
    return std::make_shared<contract::WorkerClient>(o);
  }
  StatusFeed::Options Fast() {
    StatusFeed::Options o;
    o.min_interval = 100ms;
    o.initial_backoff = 300ms;
    return o;
  }
  FakeWorker fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> wakes_{0};
};

// What wakes a reconcile: not the step's figures, a new periodic checkpoint, or how many
// copies of one part a rank holds while a newer one arrives (that woke it every step, found by
// the e2e test of a steady job); a change of phase, generation, error or held ranks does.
TEST(ActionablePartTest, StepFiguresCheckpointsAndCopyCountsAreNotActionableTheRestIs) {
  auto held = [](contract::WorkerStatus s, std::vector<std::pair<int, int64_t>> parts) {
    for (const auto& [rank, step] : parts) s.held_parts.push_back({1, rank, 2, step});
    return s;
  };
  using contract::ActionablePart;
  const contract::WorkerStatus a = held(Status(WorkerPhase::kRunning, 1, 0, 10), {{0, 9}, {1, 9}});
  contract::WorkerStatus b =
      held(Status(WorkerPhase::kRunning, 1, 0, 11), {{0, 10}, {1, 10}, {0, 11}, {1, 11}});
  b.gpu_utilization_percent = 97;
  b.uptime_millis = 12345;
  b.last_checkpoint = contract::CheckpointInfo{10, "full", "file:///c/step-10", 1};
  contract::StepEvent step;
  step.generation = 1;
  step.step = 11;
  b.recent_steps.push_back(step);
  contract::CheckpointIntervalPlan interval;
  interval.full_every_steps = 20;
  b.checkpoint_interval = interval;
  EXPECT_EQ(ActionablePart(a), ActionablePart(b));
  contract::WorkerStatus paused = a;
  paused.phase = WorkerPhase::kPaused;
  contract::WorkerStatus failed = a;
  failed.last_error = "a peer went away";
  contract::WorkerStatus next = a;
  next.generation = 2;
  contract::WorkerStatus live = a;
  live.live_checkpoint = contract::CheckpointInfo{10, "live", "", 1};
  contract::WorkerStatus prepared = a;
  prepared.prepared_engine = contract::PreparedEngine{2, 1, 4, true, ""};
  const contract::WorkerStatus lost = held(Status(WorkerPhase::kRunning, 1, 0, 10), {{0, 9}});
  for (const contract::WorkerStatus* s :
       std::vector<const contract::WorkerStatus*>{&paused, &failed, &next, &live, &prepared, &lost})
    EXPECT_NE(ActionablePart(a), ActionablePart(*s))
        << "phase " << api::WorkerPhaseName(s->phase) << ", generation " << s->generation;
}

// Every field crosses the wire and back unchanged (contract/wire.h), and a phase this build
// does not know (a newer worker's) is refused, naming it, rather than read as some other phase.
TEST(WireTest, AStatusCrossesTheWireUnchangedAndAnUnknownPhaseIsRefused) {
  contract::WorkerStatus s = Status(WorkerPhase::kCheckpointing, 3, 1, 42);
  s.max_steps = 100;
  s.learning_rate = 1e-4;
  s.grad_norm = 0.5;
  s.gpu_utilization_percent = 88;
  s.gpu_memory_used_bytes = 1 << 30;
  s.last_checkpoint = contract::CheckpointInfo{40, "full", "s3://b/c/step-40", 1700000000000};
  s.last_error = "a peer went away";
  s.last_error_permanent = true;
  s.job = "ns/job";
  s.uptime_millis = 9000;
  s.recent_steps.push_back({3, 41, 2.0, 1e-4, 0.4, 900, 0.2, 2, 17, true, 55.0, 0.01});
  s.recent_steps.push_back({3, 42, 1.9, 1e-4, 0.5, 950, 0.2, 2, 18, false, std::nullopt, 0});
  s.live_checkpoint = contract::CheckpointInfo{42, "live", "", 5};
  s.held_parts = {{3, 1, 2, 41}, {3, 0, 2, 41}};
  s.prepared_engine = contract::PreparedEngine{4, 0, 4, false, "out of memory"};
  s.checkpoint_interval =
      contract::CheckpointIntervalPlan{20, "Optimal", 1.5, 0.2, 3600, 2, 100, 90, 0.01};
  s.resumed_from = contract::CheckpointInfo{20, "full", "s3://b/c/step-20", 3};
  s.skipped_checkpoints = {"step-30: a shard's checksum does not match"};
  pb::WorkerStatus message;
  contract::ToWire(s, &message);
  StatusOr<contract::WorkerStatus> back = contract::FromWire(message);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  message.set_phase(static_cast<pb::Phase>(42));
  back = contract::FromWire(message);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(),
            "the worker reports phase 42, which this operator does not know");
}

TEST_F(StatusFeedTest, AnActionableChangeWakesTheJobAtOnceAndStepFiguresOnlyReachThePatcher) {
  StatusFeed feed(Fast(), [&](const std::string& job) {
    EXPECT_EQ(job, "ns/job");
    ++wakes_;
  });
  feed.Follow("ns/job", {{"job-worker-0", Client()}});
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.calls_ == 1; }));
  EXPECT_EQ(fake_.min_interval_ms_, 100) << "the feed asks for its interval";
  EXPECT_FALSE(feed.Pushed("ns/job", {"job-worker-0"})) << "no status yet";
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 10));
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == 1; })) << "the first status wakes";
  EXPECT_TRUE(feed.Pushed("ns/job", {"job-worker-0"}));
  EXPECT_FALSE(feed.Pushed("ns/job", {"job-worker-0", "job-worker-1"}));
  // Only the step's figures move: the patcher gets them, the job sleeps on.
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 11));
  std::map<std::string, StatusFeed::Figures> taken;
  ASSERT_TRUE(Eventually([&] {
    for (auto& [job, f] : feed.TakeChangedFigures()) taken[job] = f;
    return taken.count("ns/job") && taken["ns/job"].step == 11;
  }));
  EXPECT_EQ(taken["ns/job"].generation, 1);
  EXPECT_DOUBLE_EQ(taken["ns/job"].loss, 2.5 - 0.11);
  EXPECT_EQ(wakes_.load(), 1) << "a step woke the job";
  EXPECT_TRUE(feed.TakeChangedFigures().empty()) << "taken once";
  // What the operator acts on: at once.
  fake_.Push(Status(WorkerPhase::kPaused, 1, 0, 11));
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == 2; }));
  // Another rank's figures are not the job's.
  fake_.Push(Status(WorkerPhase::kRunning, 2, 1, 50));
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == 3; }));
  EXPECT_TRUE(feed.TakeChangedFigures().empty());
}

// What a pass may take for a worker's answer: the newest push of its open stream, through the
// client the pass holds, while it is recent; a worker that pushed once and then fell silent (a
// frozen process keeps its stream open until three heartbeats pass) is asked instead.
TEST_F(StatusFeedTest, TheNewestPushStandsForAnAnswerOnlyWhileItIsRecent) {
  StatusFeed feed(Fast(), [&](const std::string&) { ++wakes_; });
  const std::shared_ptr<contract::WorkerApi> client = Client();
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-0", client, 10s)) << "not followed";
  feed.Follow("ns/job", {{"job-worker-0", client}});
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.calls_ == 1; }));
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-0", client, 10s)) << "nothing delivered yet";
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 7));
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == 1; }));
  std::shared_ptr<const contract::WorkerStatus> latest =
      feed.Latest("ns/job", "job-worker-0", client, 10s);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 7);
  EXPECT_EQ(latest->phase, WorkerPhase::kRunning);
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-0", Client(), 10s)) << "another client's";
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-1", client, 10s));
  std::this_thread::sleep_for(60ms);  // ages the push past a 50 ms bound (no wait on an event)
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-0", client, 50ms)) << "older than allowed";
  EXPECT_TRUE(feed.Latest("ns/job", "job-worker-0", client, 10s));
}

TEST_F(StatusFeedTest, AStreamThatEndsWakesTheJobOnceAndIsReopenedOnlyAfterItsBackoff) {
  StatusFeed feed(Fast(), [&](const std::string&) { ++wakes_; });
  const auto client = Client();
  feed.Follow("ns/job", {{"job-worker-0", client}});
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 1));
  ASSERT_TRUE(Eventually([&] { return feed.Pushed("ns/job", {"job-worker-0"}); }));
  const int before = wakes_.load();
  fake_.EndStream();
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == before + 1; })) << "the end wakes the job";
  EXPECT_FALSE(feed.Pushed("ns/job", {"job-worker-0"}));
  // Followed again and again (the reconciles the wake-ups run): the stream is opened again
  // only once its backoff is over — the first second call comes after it.
  const auto ended = std::chrono::steady_clock::now();
  auto calls = [&] {
    int n = 0;
    fake_.WaitFor([&] {
      n = fake_.calls_;
      return true;
    });
    return n;
  };
  ASSERT_TRUE(Eventually([&] {
    feed.Follow("ns/job", {{"job-worker-0", client}});
    return calls() == 2;
  }));
  EXPECT_GE(std::chrono::steady_clock::now() - ended, 250ms) << "reopened inside the backoff";
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 2));
  ASSERT_TRUE(Eventually([&] { return feed.Pushed("ns/job", {"job-worker-0"}); }));
  EXPECT_EQ(wakes_.load(), before + 2) << "one wake for the end, one for the first status";
}

// A newer worker's status, in a phase this operator does not know, is never taken for an answer:
// its stream ends with why (the job is woken and polls, and GetStatus refuses it the same way).
TEST_F(StatusFeedTest, AStatusInAPhaseThisOperatorDoesNotKnowEndsTheStreamAndIsNoPush) {
  StatusFeed feed(Fast(), [&](const std::string&) { ++wakes_; });
  const auto client = Client();
  feed.Follow("ns/job", {{"job-worker-0", client}});
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 1));
  ASSERT_TRUE(Eventually([&] { return feed.Pushed("ns/job", {"job-worker-0"}); }));
  const int before = wakes_.load();
  pb::WorkerStatus newer;
  contract::ToWire(Status(WorkerPhase::kRunning, 1, 0, 2), &newer);
  newer.set_phase(static_cast<pb::Phase>(42));
  fake_.PushWire(newer);
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == before + 1; })) << "the end wakes the job";
  EXPECT_FALSE(feed.Pushed("ns/job", {"job-worker-0"}));
  EXPECT_FALSE(feed.Latest("ns/job", "job-worker-0", client, 10s)) << "an unknown phase was kept";
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.cancelled_ == 1; })) << "the stream stays open";
}

// A frozen worker (SIGSTOP, a hung host) keeps its connection and sends nothing: after three
// heartbeats without a status its stream counts as ended — the job is woken, no longer taken
// as pushed, and the stream is opened afresh.
TEST_F(StatusFeedTest, AStreamSilentForThreeHeartbeatsIsTakenAsEndedAndOpenedAfresh) {
  StatusFeed::Options o = Fast();
  o.heartbeat = 100ms;
  StatusFeed feed(o, [&](const std::string&) { ++wakes_; });
  const auto client = Client();
  feed.Follow("ns/job", {{"job-worker-0", client}});
  fake_.Push(Status(WorkerPhase::kRunning, 1, 0, 1));
  ASSERT_TRUE(Eventually([&] { return feed.Pushed("ns/job", {"job-worker-0"}); }));
  const int before = wakes_.load();
  const auto last = std::chrono::steady_clock::now();
  ASSERT_TRUE(Eventually([&] {
    feed.Sweep();
    return wakes_.load() == before + 1;
  }));
  // `last` is read just after the status arrived: three heartbeats from then, less that gap.
  EXPECT_GE(std::chrono::steady_clock::now() - last, 250ms) << "given up before 3 heartbeats";
  EXPECT_FALSE(feed.Pushed("ns/job", {"job-worker-0"}));
  feed.Follow("ns/job", {{"job-worker-0", client}});
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.calls_ == 2 && fake_.cancelled_ == 1; }));
}

TEST_F(StatusFeedTest, AWrongTokenIsNoPushAndAnUnfollowedPodsStreamIsClosed) {
  StatusFeed feed(Fast(), [&](const std::string&) { ++wakes_; });
  feed.Follow("ns/refused", {{"job-worker-0", Client("wrong")}});
  ASSERT_TRUE(Eventually([&] { return wakes_.load() == 1; })) << "the refusal ends the stream";
  EXPECT_FALSE(feed.Pushed("ns/refused", {"job-worker-0"}));
  EXPECT_EQ(fake_.calls_, 0);

  feed.Follow("ns/job", {{"job-worker-0", Client()}});
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.calls_ == 1; }));
  feed.Follow("ns/job", {});  // the pod went: its stream is cancelled
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.cancelled_ == 1; }));
  feed.Forget("ns/refused");
  EXPECT_EQ(feed.streams(), 0u);
}

}  // namespace
}  // namespace tidal::controller
