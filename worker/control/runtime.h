// worker/control/runtime.h — a worker's life across generations (DESIGN.md §4), behind the
// gRPC service and independent of it. One training thread runs each generation's session;
// requests from the control API (rendezvous, checkpoint barrier, pause, shutdown) are raised
// as flags that every rank agrees on at the next optimizer-step boundary, so all ranks act at
// the same step whichever of them heard first. A request belongs to a barrier: one that reaches
// a rank whose barrier for it is under way (another rank heard first) — or, named by the
// caller's id, is already over — joins that barrier and leaves no flag behind to fire again
// later. No LibTorch types here.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/checkpoint_interval.h"
#include "api/train_config.h"
#include "api/worker_phase.h"
#include "common/status.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/control/gpu_monitor.h"
#include "worker/control/loss_hook.h"
#include "worker/engine/session.h"
#include "worker/engine/step_record.h"
#include "worker/objstore/memory_store.h"
#include "worker/objstore/object_store.h"

namespace tidal::worker {

using Phase = api::WorkerPhase;
inline const char* PhaseName(Phase phase) { return api::WorkerPhaseName(phase); }

struct CheckpointRef {
  int64_t step = 0;
  std::string kind;  // "full" | "snapshot" | "live" (in the ranks' memory)
  std::string uri;
  int64_t unix_millis = 0;
};

struct StepEvent {
  uint64_t seq = 0;  // increases by one per event over the worker's life
  int64_t generation = 0;
  engine::StepRecord record;
  int64_t unix_millis = 0;
  std::optional<GpuSample> gpu;  // sampled as the step ended; none on a CPU worker
};

// One part of the state a worker holds in memory (worker.proto HeldPart): rank `rank`'s 1/W of
// generation `generation` at `step`, its own or its ward's (a buddy copy).
struct HeldPart {
  int64_t generation = 0;
  int rank = 0, world_size = 0;
  int64_t step = 0;
  bool operator==(const HeldPart&) const = default;
};

// Buddy copies in a generation (worker.proto RendezvousRequest): its members' control
// addresses in rank order, and the rank whose part this worker copies. No members: none.
struct BuddyRing {
  std::vector<std::string> members;
  int ward = 0;
};

// The newest PrepareEngine (worker.proto PreparedEngine): an engine built ahead of the worker's
// first generation, or the base weights a member read ahead for its next shard.
struct PreparedEngine {
  int64_t generation = 0;
  int rank = 0, world_size = 0;  // planned
  bool ready = false;
  std::string error;
};

struct WorkerState {
  Phase phase = Phase::kWaiting;
  int64_t generation = 0;
  int rank = 0, world_size = 0;
  int64_t step = 0, max_steps = 0;
  std::optional<engine::StepRecord> last_step;
  std::optional<GpuSample> gpu;  // with last_step
  // The newest committed to the store, or the one this generation resumed from (the newest
  // usable one, when newer ones were corrupt).
  std::optional<CheckpointRef> last_checkpoint;
  // This generation's resume from a store (unset: from the peers' memory, or at step 0), and
  // the newer checkpoints it skipped as corrupt ("step-…: why"; rank 0's list is complete).
  std::optional<CheckpointRef> resumed_from;
  std::vector<std::string> skipped_checkpoints;
  // The live checkpoint this worker holds its part of in memory (peer_state()), until the
  // generation that reads it has started.
  std::optional<CheckpointRef> live_checkpoint;
  // The buddy copies it holds (its own and its ward's), newest last; kept after a failed
  // generation until the next one has started.
  std::vector<HeldPart> held;
  std::string last_error;
  // The last generation could not start for a reason a restart cannot fix (a spec field the
  // worker cannot honour: a missing file, a rank the model cannot take, a precision the device
  // lacks, a checkpoint of another configuration). The operator stops restarting the job.
  bool last_error_permanent = false;
  std::optional<PreparedEngine> prepared;  // asked for by PrepareEngine
  // spec.checkpoint.fullEverySteps auto: the interval planned last, and from what (rank 0's).
  struct CheckpointInterval {
    api::IntervalInputs inputs;
    api::IntervalPlan plan;
  };
  std::optional<CheckpointInterval> checkpoint_interval;
};

// Told what the training thread does, as it happens (the worker's /metrics). Called from the
// training thread, without the runtime's lock held.
class RuntimeObserver {
 public:
  virtual ~RuntimeObserver() = default;
  virtual void OnGeneration(int64_t generation, int rank, int world_size) = 0;
  virtual void OnStep(const engine::StepRecord& record, const std::optional<GpuSample>& gpu) = 0;
  virtual void OnCheckpoint(const checkpoint::CommitInfo& commit) = 0;
  // A checkpoint that was not committed (a write or the commit failed on some rank).
  virtual void OnCheckpointFailed(checkpoint::CheckpointKind kind, const Status& why) = 0;
  // A resume skipped `count` newer checkpoints as corrupt.
  virtual void OnCorruptCheckpointsSkipped(size_t count) { (void)count; }
};

// Where a generation resumes from when the previous one left a live checkpoint: its ranks'
// control addresses (rank order) and the step.
struct LiveState {
  std::vector<std::string> peers;
  int64_t step = 0;
};

struct RuntimeOptions {
  engine::TrainConfig config;
  checkpoint::CheckpointPolicy policy;  // uri, intervals, keep; resume from the newest
  objstore::S3Options s3;
  engine::SessionOptions session;
  std::string interface_host = "127.0.0.1";  // this worker's address, for gloo
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(120)};
  RuntimeObserver* observer = nullptr;  // not owned; outlives the runtime
  GpuMonitor* gpu = nullptr;            // not owned; none on a CPU worker
  LossHook loss_hook;                   // a test hook on the reported loss (loss_hook.h)
  // A test hook (TIDAL_TEST_BARRIER_HOLD=until-request): every checkpoint barrier holds, once
  // agreed, until the next Checkpoint or Pause call has reached this worker, so a test can
  // deliver a request to a rank that is inside the barrier the request asks for.
  bool hold_barriers_until_request = false;
  // A test hook (TIDAL_TEST_STALL_AT_STEP=N): in generation 1, rank 0's training thread stops
  // for good once it has published step N, while the worker goes on answering: a hang the
  // operator's stall detector must find (the other ranks wait in their next collective).
  int64_t stall_at_step = 0;
  // Opens the previous generation's live checkpoint on its peers (worker/control/peer_store.h
  // over the control API); null: a Rendezvous naming peers resumes from the store.
  std::function<StatusOr<std::shared_ptr<objstore::ObjectStore>>(const LiveState& from)> open_peers;
  // The most this worker keeps in memory for its peers (a live checkpoint's part, buddy copies).
  uint64_t peer_state_capacity_bytes = 8ull << 30;
  // A buddy copy every this many steps (spec.checkpoint.buddyEverySteps); 0: none.
  int64_t buddy_every = 0;
  // Reads the whole object `key` of the peer state of the worker at `address` (ReadState); a
  // ward's part is copied with it. Null: no buddy copies.
  std::function<StatusOr<std::string>(const std::string& address, const std::string& key)>
      read_peer_object;
  // The engine (model, data, the base weights this rank still holds) is kept from one
  // generation to the next: engine::Session::Regroup. False (TIDAL_KEEP_ENGINE=0): every
  // generation builds it anew (Join), the way to measure what keeping it saves.
  bool keep_engine = true;
};

class WorkerRuntime {
 public:
  explicit WorkerRuntime(RuntimeOptions options);
  ~WorkerRuntime();  // leaves any generation and joins the training thread
  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;

  // Accepts the membership of a newer generation. A running generation is left at the next
  // step boundary (every rank agrees; the state is checkpointed first, so nothing is lost); a
  // paused or failed one at once. Refused when `generation` is not newer: AlreadyExists when
  // it is this worker's (a repeated call), FailedPrecondition when it is older.
  // With `from.peers`, the generation resumes from their live checkpoint of `from.step`, or from
  // the store's newest when that cannot be read.
  // With `ring`, the generation keeps buddy copies (RuntimeOptions::buddy_every).
  Status Rendezvous(const engine::Membership& membership, LiveState from = {}, BuddyRing ring = {});
  // Readies the engine for `planned` (a rank and world size in a newer generation) while the
  // job trains, so that the Rendezvous into it holds no load. A new worker builds its engine
  // (engine::Session::Prepare) on the training thread and stays WAITING. A member of a
  // training generation reads the base weights it will hold there and does not hold now
  // (engine::Session::ReadAhead) on a thread of its own, and trains on. State().prepared says
  // how it goes. FailedPrecondition without keep_engine or for an older generation,
  // AlreadyExists for the worker's own,
  // or while nothing trains (joining, held for a Rendezvous). A call while one is under way or
  // done for an older generation only records the newer one: the Regroup re-cuts whatever
  // the plan that was read for missed.
  Status PrepareEngine(const engine::Membership& planned);
  // A full checkpoint at the next agreed step boundary; with `pause`, hold after it. Waits
  // until it is committed, the generation ends, or `deadline`. `barrier_id` names the barrier
  // (the operator sends one id to every rank, increasing within a generation; 0: unnamed): a
  // request joins the newest barrier of the generation when that one checkpoints (and pauses,
  // if asked) and is under way, or is over and carries this id or a later one.
  // With `live`, the checkpoint is kept in the ranks' memory (peer_state(), kind "live") for the
  // next generation, and nothing is written to the store.
  StatusOr<CheckpointRef> Checkpoint(bool pause, std::chrono::steady_clock::time_point deadline,
                                     uint64_t barrier_id = 0, bool live = false);
  // Hold at the next agreed step boundary (or join a pausing barrier, as Checkpoint); returns
  // the step it holds at.
  StatusOr<int64_t> Pause(std::chrono::steady_clock::time_point deadline, uint64_t barrier_id = 0);
  Status Resume();
  // Leaves the generation (checkpointed first when it is running) and stops the training
  // thread; `exited()` turns true once it has.
  void Shutdown(const std::string& reason);

  WorkerState State() const;
  // This worker's part of its newest live checkpoint and its buddy copies, served to peers
  // (ReadState).
  objstore::MemoryStore& peer_state() { return peer_state_; }
  // Events with seq > `after_seq` (at most `max`), waiting until there is one, `deadline`, or
  // shutdown. `FirstSeqAfterStep` turns a step into a starting point.
  std::vector<StepEvent> EventsAfter(uint64_t after_seq, size_t max,
                                     std::chrono::steady_clock::time_point deadline) const;
  uint64_t FirstSeqAfterStep(int64_t after_step) const;
  // The newest `max` events, oldest first, without waiting.
  std::vector<StepEvent> RecentEvents(size_t max) const;
  // True once the training thread is done: shut down, or the job trained to its last step.
  bool exited() const;
  bool WaitExited(std::chrono::steady_clock::time_point deadline) const;

 private:
  enum Flag : uint32_t { kCheckpointFlag = 1, kPauseFlag = 2, kLeaveFlag = 4, kLiveFlag = 8 };
  static constexpr int kFlagCount = 4;  // the flags a barrier serves (done_with_)
  // Raised by rank 0 when the store's checkpoint fence names a newer generation (FenceWatch in
  // runtime.cc): every rank leaves at that boundary, without a checkpoint.
  static constexpr uint32_t kSupersededFlag = 1u << kFlagCount;
  class FenceWatch;
  enum class Held { kResume, kLeave, kAgree };
  // Under mu_: the barrier a request for `flags` named `id` belongs to (see Checkpoint): the
  // newest one, or the next one with `flags` raised for it. Returns its index.
  uint64_t JoinOrRequest(uint32_t flags, uint64_t id);
  // Under mu_: OK when a Rendezvous or PrepareEngine for `generation` may be accepted (not
  // shutting down or finished, and newer than the current and the pending generation).
  Status AcceptsGeneration(int64_t generation) const;
  // Under mu_: whether barrier `index`, or a later one acting on every flag of `flags`, is over.
  bool Served(uint32_t flags, uint64_t index) const;
  void Loop();
  // One generation, from joining to leaving; returns why it ended (OK: left on request or
  // finished).
  Status RunGeneration(const engine::Membership& membership, const LiveState& from,
                       const BuddyRing& ring);
  // PrepareEngine's work, on the training thread: kept_session_ and state_.prepared set.
  void Prepare(const engine::Membership& planned);
  // PrepareEngine's work for a member that trains, on ahead_thread_: state_.prepared set.
  void ReadAhead(engine::Session& session, const engine::Membership& planned);
  // The session for `m`: the kept one regrouped, or a new one.
  StatusOr<std::unique_ptr<engine::Session>> EnterGeneration(const engine::Membership& m);
  Status TrainGeneration(engine::Session& session, const engine::Membership& m,
                         const LiveState& from, const BuddyRing& ring);
  class Buddy;  // a generation's buddy copies (runtime.cc)
  Status TrainUntilLeave(engine::Session& session, engine::TrainingHooks& hooks, Buddy* buddy,
                         FenceWatch* fence);
  // In PAUSED: waits for Resume, a reason to leave, or a checkpoint request (kAgree: every rank
  // is asked the same, so they agree on it at this boundary without a step).
  Held HoldPaused();
  // HoldPaused, then: false to leave the generation; true to go on (running again, or with
  // `step_first` false to agree on a request first).
  bool StayHeld(bool& step_first);
  void SetPhase(Phase phase);
  void PublishStep(engine::StepRecord record);  // after the loss hook
  // Ends the barrier under way; with `pause` (and a result), the phase turns PAUSED at once.
  void EndBarrier(const StatusOr<CheckpointRef>& result, bool pause);

  RuntimeOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  WorkerState state_;
  std::optional<engine::Membership> pending_;          // the next generation, not yet joined
  LiveState pending_from_;                             // and where it resumes from
  BuddyRing pending_ring_;                             // and its buddy copies
  std::optional<engine::Membership> pending_prepare_;  // PrepareEngine's, not yet started
  uint32_t requested_ = 0;                             // flags raised by the control API
  uint64_t requested_id_ = 0;                          // the largest id of the requests behind them
  bool resume_requested_ = false;
  bool shutdown_ = false;
  bool exited_ = false;
  // Checkpoint barriers: begun and finished counts (over the worker's life, so an index names
  // one barrier), and the newest one's result, flags (kCheckpointFlag always: every barrier
  // checkpoints; 0: none yet in this generation) and agreed id.
  uint64_t barriers_begun_ = 0, barriers_done_ = 0;
  StatusOr<CheckpointRef> barrier_result_ = Aborted("no checkpoint barrier yet");
  uint32_t barrier_flags_ = 0;
  uint64_t barrier_id_ = 0;
  int64_t paused_step_ = 0;  // where the newest pausing barrier held
  // Per flag, the index of the newest barrier that acted on it and finished.
  uint64_t done_with_[kFlagCount] = {};
  uint64_t control_requests_ = 0;  // Checkpoint and Pause calls received (the test hook)
  std::deque<StepEvent> events_;   // the newest kMaxEvents
  objstore::MemoryStore peer_state_;
  uint64_t next_seq_ = 1;
  // The last generation's session, kept for the next (the training thread's alone).
  std::unique_ptr<engine::Session> kept_session_;
  // The generation's session while it trains (under mu_; owned by the training thread), the
  // thread reading ahead on it, and whether that runs. The training thread joins it before
  // the session leaves its generation.
  engine::Session* current_session_ = nullptr;
  std::thread ahead_thread_;
  bool reading_ahead_ = false;
  std::thread thread_;
};

}  // namespace tidal::worker
