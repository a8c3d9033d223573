// worker/control/runtime.cc — the worker's generations: join, resume, train, agree on
// requests at step boundaries, checkpoint before leaving, and report.
#include "worker/control/runtime.h"

#include <algorithm>
#include <thread>

#include "common/log.h"
#include "worker/checkpoint/manifest.h"
#include "worker/control/buddy.h"

namespace tidal::worker {
namespace {

constexpr size_t kMaxEvents = 4096;

int64_t NowMillis() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// Whether a generation that failed before its first step failed for good: bad input
// (InvalidArgument), something the spec names that is not there (NotFound), or a state the
// spec contradicts (FailedPrecondition). Peers, the network and the store (Unavailable,
// DeadlineExceeded, Aborted) and anything after training started are worth a restart.
bool Permanent(const Status& failure, bool started) {
  if (started) return false;
  return failure.code() == StatusCode::kInvalidArgument ||
         failure.code() == StatusCode::kNotFound ||
         failure.code() == StatusCode::kFailedPrecondition;
}

// A barrier named (barrier_id: the generation in the high 32 bits) for a generation older than
// `current` is over: the operator's call for it arrived late — its calls run off its reconcile,
// so one can reach a worker after the Rendezvous that ended that generation — and applying it
// would pause the new generation for nobody.
Status StaleBarrier(uint64_t id, int64_t current) {
  const int64_t named = static_cast<int64_t>(id >> 32);
  if (id == 0 || named >= current) return OkStatus();
  return FailedPrecondition(
      "barrier " + std::to_string(id) + " is of generation " + std::to_string(named) +
      ", which is over: this worker is in generation " + std::to_string(current));
}

bool InGeneration(Phase p) {
  return p == Phase::kJoining || p == Phase::kRunning || p == Phase::kCheckpointing ||
         p == Phase::kPaused;
}

}  // namespace

WorkerRuntime::WorkerRuntime(RuntimeOptions options)
    : options_(std::move(options)),
      peer_state_(options_.config.name + "/peer-state", options_.peer_state_capacity_bytes) {
  Logger::Get().SetContext({options_.config.name, -1, 0});
  thread_ = std::thread([this] { Loop(); });
}

WorkerRuntime::~WorkerRuntime() {
  Shutdown("worker destroyed");
  if (thread_.joinable()) thread_.join();
}

Status WorkerRuntime::Rendezvous(const engine::Membership& m, LiveState from, BuddyRing ring) {
  if (m.world_size < 1 || m.rank < 0 || m.rank >= m.world_size)
    return InvalidArgument("rank " + std::to_string(m.rank) + " is outside world size " +
                           std::to_string(m.world_size));
  if (m.world_size > 1 && (m.store_host.empty() || m.store_port <= 0 || m.store_port > 65535))
    return InvalidArgument("store_address: expected HOST:PORT with a port in 1-65535");
  if (Status fits = options_.config.ValidateForWorldSize(m.world_size); !fits.ok()) return fits;
  if (!ring.members.empty() && static_cast<int>(ring.members.size()) != m.world_size)
    return InvalidArgument("members: expected one address per rank (" +
                           std::to_string(m.world_size) + "), got " +
                           std::to_string(ring.members.size()));
  if (!ring.members.empty() && (ring.ward < 0 || ring.ward >= m.world_size))
    return InvalidArgument("ward: expected a rank in 0-" + std::to_string(m.world_size - 1) +
                           ", got " + std::to_string(ring.ward));
  std::lock_guard<std::mutex> lock(mu_);
  if (Status open = AcceptsGeneration(m.generation); !open.ok()) return open;
  pending_ = m;
  pending_from_ = std::move(from);
  pending_ring_ = std::move(ring);
  if (InGeneration(state_.phase)) JoinOrRequest(kLeaveFlag, 0);
  changed_.notify_all();
  return OkStatus();
}

Status WorkerRuntime::AcceptsGeneration(int64_t generation) const {
  if (shutdown_) return FailedPrecondition("the worker is shutting down");
  if (state_.phase == Phase::kSucceeded) return FailedPrecondition("the job has finished");
  const int64_t newest = std::max(state_.generation, pending_ ? pending_->generation : 0);
  // The same generation again (an operator that lost the answer asks again): AlreadyExists,
  // which the caller takes as done; an older one is a caller behind the worker.
  if (generation == newest)
    return AlreadyExists("generation " + std::to_string(generation) +
                         " is this worker's generation already");
  if (generation < newest)
    return FailedPrecondition("generation " + std::to_string(generation) +
                              " is older than this worker's generation " + std::to_string(newest));
  return OkStatus();
}

Status WorkerRuntime::PrepareEngine(const engine::Membership& planned) {
  if (planned.generation < 1) return InvalidArgument("generation: expected >= 1");
  if (planned.world_size < 1 || planned.rank < 0 || planned.rank >= planned.world_size)
    return InvalidArgument("rank " + std::to_string(planned.rank) + " is outside world size " +
                           std::to_string(planned.world_size));
  if (Status fits = options_.config.ValidateForWorldSize(planned.world_size); !fits.ok())
    return fits;
  if (!options_.keep_engine)
    return FailedPrecondition(
        "TIDAL_KEEP_ENGINE=0: this worker builds its engine when it joins a generation");
  std::lock_guard<std::mutex> lock(mu_);
  if (Status open = AcceptsGeneration(planned.generation); !open.ok()) return open;
  std::optional<PreparedEngine>& p = state_.prepared;
  if (p && p->generation == planned.generation && p->rank == planned.rank &&
      p->world_size == planned.world_size)
    return OkStatus();           // a repeated ask
  if (state_.generation == 0) {  // a new worker: its engine, built on the training thread
    if (p) {  // built (or building) for another plan: the Regroup re-cuts the shard
      p->generation = planned.generation;
      p->rank = planned.rank;
      p->world_size = planned.world_size;
      return OkStatus();
    }
    pending_prepare_ = planned;
  } else {  // a member that trains: the base weights it lacks for the plan, read meanwhile
    if (pending_ || state_.phase == Phase::kJoining || !current_session_)
      return FailedPrecondition("phase " + std::string(PhaseName(state_.phase)) +
                                ": nothing trains to read ahead beside");
    if (reading_ahead_)
      return FailedPrecondition("reading ahead for rank " + std::to_string(p->rank) + " of " +
                                std::to_string(p->world_size) + " in generation " +
                                std::to_string(p->generation) + ": ask again once it is done");
    if (ahead_thread_.joinable()) ahead_thread_.join();  // an earlier one, over
    reading_ahead_ = true;
    ahead_thread_ =
        std::thread([this, planned, session = current_session_] { ReadAhead(*session, planned); });
  }
  state_.prepared = PreparedEngine{planned.generation, planned.rank, planned.world_size, false, ""};
  changed_.notify_all();
  return OkStatus();
}

void WorkerRuntime::ReadAhead(engine::Session& session, const engine::Membership& planned) {
  // Cut short once the generation ends (a barrier that did not wait for it, a failure) or the
  // worker shuts down: what was read is kept, the Regroup reads the rest.
  bool complete = false;
  Status read = session.ReadAhead(
      planned,
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return shutdown_ || current_session_ == nullptr;
      },
      &complete);
  std::lock_guard<std::mutex> lock(mu_);
  if (read.ok() && complete) {
    state_.prepared->ready = true;
  } else if (read.ok()) {
    state_.prepared->error = "cut short: the generation ended first";
  } else {
    state_.prepared->error = read.message();
    LogWarn("base weights not read ahead: the next generation reads them",
            {{"error", read.message()}});
  }
  reading_ahead_ = false;
  changed_.notify_all();
}

uint64_t WorkerRuntime::JoinOrRequest(uint32_t flags, uint64_t id) {
  const bool covers = barrier_flags_ != 0 && (flags & ~barrier_flags_) == 0;
  const bool under_way = barriers_begun_ > barriers_done_;
  if (covers && (under_way || (id != 0 && id <= barrier_id_))) return barriers_begun_;
  requested_ |= flags;
  requested_id_ = std::max(requested_id_, id);
  changed_.notify_all();
  return barriers_begun_ + 1;
}

bool WorkerRuntime::Served(uint32_t flags, uint64_t index) const {
  for (int bit = 0; bit < kFlagCount; ++bit)
    if ((flags & (1u << bit)) && done_with_[bit] < index) return false;
  return true;
}

StatusOr<CheckpointRef> WorkerRuntime::Checkpoint(bool pause,
                                                  std::chrono::steady_clock::time_point deadline,
                                                  uint64_t barrier_id, bool live) {
  std::unique_lock<std::mutex> lock(mu_);
  ++control_requests_;
  changed_.notify_all();
  if (!InGeneration(state_.phase))
    return FailedPrecondition(std::string("no generation to checkpoint (phase ") +
                              PhaseName(state_.phase) + ")");
  TIDAL_RETURN_IF_ERROR(StaleBarrier(barrier_id, state_.generation));
  // Every pause is checkpointed, so a paused worker already holds one at its step: in the
  // store, which serves a live request too, or (for a live request) in memory.
  if (state_.phase == Phase::kPaused) {
    if (state_.last_checkpoint && state_.last_checkpoint->step == state_.step)
      return *state_.last_checkpoint;
    if (live && state_.live_checkpoint && state_.live_checkpoint->step == state_.step)
      return *state_.live_checkpoint;
  }
  const uint32_t flags =
      (live ? kLiveFlag : kCheckpointFlag) | (pause ? uint32_t{kPauseFlag} : uint32_t{0});
  const uint64_t target = JoinOrRequest(flags, barrier_id);
  const int64_t generation = state_.generation;
  const bool done = changed_.wait_until(lock, deadline, [&] {
    return Served(flags, target) || state_.generation != generation ||
           !InGeneration(state_.phase) || shutdown_;
  });
  if (Served(flags, target)) return barrier_result_;
  if (!done)
    return DeadlineExceeded("no agreed step boundary before the deadline (phase " +
                            std::string(PhaseName(state_.phase)) + ", step " +
                            std::to_string(state_.step) + ")");
  return Aborted("generation " + std::to_string(generation) + " ended before the checkpoint" +
                 (state_.last_error.empty() ? "" : ": " + state_.last_error));
}

StatusOr<int64_t> WorkerRuntime::Pause(std::chrono::steady_clock::time_point deadline,
                                       uint64_t barrier_id) {
  std::unique_lock<std::mutex> lock(mu_);
  ++control_requests_;
  changed_.notify_all();
  TIDAL_RETURN_IF_ERROR(StaleBarrier(barrier_id, state_.generation));
  if (state_.phase == Phase::kPaused) return state_.step;
  if (!InGeneration(state_.phase))
    return FailedPrecondition(std::string("no generation to pause (phase ") +
                              PhaseName(state_.phase) + ")");
  const uint64_t target = JoinOrRequest(kPauseFlag, barrier_id);
  const int64_t generation = state_.generation;
  const bool done = changed_.wait_until(lock, deadline, [&] {
    return Served(kPauseFlag, target) || state_.generation != generation ||
           !InGeneration(state_.phase) || shutdown_;
  });
  // Served: paused now, or resumed since from the pause this call belongs to.
  if (Served(kPauseFlag, target) && state_.generation == generation) return paused_step_;
  if (!done) return DeadlineExceeded("no agreed step boundary before the deadline");
  return Aborted("generation " + std::to_string(generation) + " ended before it paused");
}

Status WorkerRuntime::Resume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.phase != Phase::kPaused)
    return FailedPrecondition(std::string("not paused (phase ") + PhaseName(state_.phase) + ")");
  resume_requested_ = true;
  changed_.notify_all();
  return OkStatus();
}

void WorkerRuntime::Shutdown(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  LogInfo("shutting down", {{"reason", reason}, {"phase", PhaseName(state_.phase)}});
  shutdown_ = true;
  if (InGeneration(state_.phase)) JoinOrRequest(kLeaveFlag, 0);
  changed_.notify_all();
}

WorkerState WorkerRuntime::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool WorkerRuntime::exited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exited_;
}

bool WorkerRuntime::WaitExited(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_until(lock, deadline, [&] { return exited_; });
}

std::vector<StepEvent> WorkerRuntime::EventsAfter(
    uint64_t after_seq, size_t max, std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] {
    return (!events_.empty() && events_.back().seq > after_seq) || exited_ || shutdown_;
  });
  std::vector<StepEvent> out;
  for (const StepEvent& e : events_) {
    if (e.seq <= after_seq) continue;
    out.push_back(e);
    if (out.size() >= max) break;
  }
  return out;
}

std::vector<StepEvent> WorkerRuntime::RecentEvents(size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = std::min(max, events_.size());
  return std::vector<StepEvent>(events_.end() - static_cast<std::ptrdiff_t>(n), events_.end());
}

uint64_t WorkerRuntime::FirstSeqAfterStep(int64_t after_step) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The newest run of events (a recovery may repeat step numbers): back up while steps are
  // beyond after_step.
  uint64_t seq = events_.empty() ? next_seq_ - 1 : events_.back().seq;
  for (auto it = events_.rbegin(); it != events_.rend() && it->record.step > after_step; ++it)
    seq = it->seq - 1;
  return seq;
}

void WorkerRuntime::SetPhase(Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.phase = phase;
  changed_.notify_all();
}

void WorkerRuntime::PublishStep(engine::StepRecord record) {
  record.loss = options_.loss_hook.Apply(record.step, record.loss);
  std::optional<GpuSample> gpu;
  if (options_.gpu) gpu = options_.gpu->Sample();
  const WorkerState state = State();
  if (state.rank == 0) {  // one line per step from rank 0, for `kubectl logs`
    nlohmann::json fields = {{"step", record.step},
                             {"loss", record.loss},
                             {"lr", record.lr},
                             {"grad_norm", record.grad_norm},
                             {"tokens_per_s", record.tokens_per_s},
                             {"seconds", record.seconds},
                             {"data_wait_s", record.data_wait_seconds},
                             {"world_size", record.world_size},
                             {"micro_batch", record.micro_batch},
                             {"max_steps", state.max_steps}};
    if (record.peak_memory_bytes >= 0) fields["peak_memory_bytes"] = record.peak_memory_bytes;
    fields["gradient_bytes"] = record.gradient_bytes;
    if (record.compressed) fields["compressed"] = true;
    if (gpu) fields["gpu_util_percent"] = gpu->utilization_percent;
    LogInfo("step", fields);
  }
  if (options_.observer) options_.observer->OnStep(record, gpu);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.step = record.step;
    state_.last_step = record;
    state_.gpu = gpu;
    events_.push_back({next_seq_++, state_.generation, record, NowMillis(), gpu});
    if (events_.size() > kMaxEvents) events_.pop_front();
    changed_.notify_all();
  }
  if (options_.stall_at_step > 0 && record.step == options_.stall_at_step &&
      state.generation == 1 && state.rank == 0) {
    LogWarn("test hook: the training thread stalls here for good (TIDAL_TEST_STALL_AT_STEP)",
            {{"step", record.step}});
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void WorkerRuntime::EndBarrier(const StatusOr<CheckpointRef>& result, bool pause) {
  std::lock_guard<std::mutex> lock(mu_);
  barriers_done_ = barriers_begun_;
  barrier_result_ = result;
  if (result.ok()) {
    // A pause is done only where the ranks hold: a barrier that also leaves does not pause.
    const uint32_t did = pause ? barrier_flags_ : barrier_flags_ & ~uint32_t{kPauseFlag};
    for (int bit = 0; bit < kFlagCount; ++bit)
      if (did & (1u << bit)) done_with_[bit] = barriers_done_;
    if (pause) {  // in the same breath: a Pause that returns finds the rank PAUSED
      state_.phase = Phase::kPaused;
      paused_step_ = state_.step;
      LogInfo("paused", {{"step", state_.step}, {"barrier_id", barrier_id_}});
    }
  }
  changed_.notify_all();
}

void WorkerRuntime::Loop() {
  while (true) {
    engine::Membership m;
    LiveState from;
    BuddyRing ring;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(
          lock, [&] { return pending_.has_value() || pending_prepare_.has_value() || shutdown_; });
      if (shutdown_) break;
      if (pending_prepare_) {
        const engine::Membership planned = *pending_prepare_;
        pending_prepare_.reset();
        if (!pending_) {
          lock.unlock();
          Prepare(planned);
          continue;
        }
        state_.prepared->error = "a Rendezvous came first";  // it builds the engine as it joins
      }
      m = *pending_;
      from = std::move(pending_from_);
      pending_.reset();
      pending_from_ = {};
      ring = std::move(pending_ring_);
      pending_ring_ = {};
      requested_ = 0;
      requested_id_ = 0;
      barrier_flags_ = 0;  // a request of this generation joins none of the last one's barriers
      barrier_id_ = 0;
      resume_requested_ = false;
      state_.phase = Phase::kJoining;
      state_.generation = m.generation;
      state_.rank = m.rank;
      state_.world_size = m.world_size;
      changed_.notify_all();
    }
    Logger::Get().SetContext({options_.config.name, m.rank, static_cast<int>(m.generation)});
    if (options_.observer) options_.observer->OnGeneration(m.generation, m.rank, m.world_size);
    LogInfo("joining generation", {{"world_size", m.world_size},
                                   {"store", m.store_host + ":" + std::to_string(m.store_port)}});
    const Status ended = RunGeneration(m, from, ring);
    std::lock_guard<std::mutex> lock(mu_);
    if (barriers_begun_ > barriers_done_) {  // a barrier cut short by the failure
      barriers_done_ = barriers_begun_;
      barrier_result_ = ended.ok() ? Aborted("the generation ended") : ended;
    }
    if (!ended.ok()) {
      // The phase is still Joining when the generation never reached its first step.
      state_.last_error_permanent = Permanent(ended, state_.phase != Phase::kJoining);
      state_.phase = Phase::kFailed;
      state_.last_error = ended.message();
      LogError("generation failed", {{"error", ended.message()},
                                     {"step", state_.step},
                                     {"permanent", state_.last_error_permanent}});
    } else if (state_.phase != Phase::kSucceeded) {
      state_.phase = Phase::kWaiting;
      LogInfo("left generation", {{"step", state_.step}});
    }
    changed_.notify_all();
    if (state_.phase == Phase::kSucceeded) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  exited_ = true;
  changed_.notify_all();
}

void WorkerRuntime::Prepare(const engine::Membership& planned) {
  LogInfo("preparing engine", {{"for_generation", planned.generation},
                               {"planned_rank", planned.rank},
                               {"planned_world_size", planned.world_size}});
  StatusOr<std::unique_ptr<engine::Session>> session =
      engine::Session::Prepare(options_.config, planned, options_.session);
  if (session.ok()) kept_session_ = std::move(*session);
  std::lock_guard<std::mutex> lock(mu_);
  if (session.ok()) {
    state_.prepared->ready = true;
  } else {
    state_.prepared->error = session.status().message();
    LogWarn("engine not prepared: it is built when the worker joins",
            {{"error", session.status().message()}});
  }
  changed_.notify_all();
}

// A generation the operator replaced while its ranks still train (a worker it could not reach:
// the job token's Secret lost, a partition) must stop at once, not at its next commit (which the
// fence refuses anyway): rank 0 reads the store's fence every kFenceCheckEvery of training and
// raises kSupersededFlag when a newer generation has started. One small read per interval; a
// store that cannot be read is no reason to stop (the commit's own check stands).
constexpr auto kFenceCheckEvery = std::chrono::seconds(2);

class WorkerRuntime::FenceWatch {
 public:
  FenceWatch(std::unique_ptr<objstore::ObjectStore> store, int64_t generation)
      : store_(std::move(store)), repo_(*store_), generation_(generation) {}
  // The newer generation holding the fence, checked at most every kFenceCheckEvery.
  std::optional<int64_t> Newer() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return std::nullopt;
    next_ = now + kFenceCheckEvery;
    auto fence = repo_.ReadFence();
    if (!fence.ok() || *fence <= generation_) return std::nullopt;
    return *fence;
  }

 private:
  std::unique_ptr<objstore::ObjectStore> store_;
  checkpoint::Repository repo_;
  int64_t generation_;
  std::chrono::steady_clock::time_point next_{};
};

Status WorkerRuntime::RunGeneration(const engine::Membership& membership, const LiveState& from,
                                    const BuddyRing& ring) {
  engine::Membership m = membership;
  m.interface_host = options_.interface_host;
  m.timeout = options_.collective_timeout;
  TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<engine::Session> session, EnterGeneration(m));
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_session_ = session.get();
  }
  const Status ended = TrainGeneration(*session, m, from, ring);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_session_ = nullptr;  // no read ahead starts on it any more
  }
  // A read ahead under way ends before the session leaves the generation.
  if (ahead_thread_.joinable()) ahead_thread_.join();
  // Kept however the generation ended: its base weights are never written, and everything
  // that training changes is rebuilt by the next generation's resume.
  if (options_.keep_engine && session->usable()) kept_session_ = std::move(session);
  return ended;
}

StatusOr<std::unique_ptr<engine::Session>> WorkerRuntime::EnterGeneration(
    const engine::Membership& m) {
  std::unique_ptr<engine::Session> session = std::move(kept_session_);
  if (!session) return engine::Session::Join(options_.config, m, options_.session);
  Status regrouped = session->Regroup(m, options_.session);
  if (regrouped.ok()) return session;
  // A group that cannot form fails the generation as a Join's would; the engine is kept for
  // the next one when it survived.
  if (session->usable()) kept_session_ = std::move(session);
  return regrouped;
}

Status WorkerRuntime::TrainGeneration(engine::Session& session, const engine::Membership& m,
                                      const LiveState& from, const BuddyRing& ring) {
  checkpoint::CheckpointPolicy policy = options_.policy;
  policy.resume = true;  // every generation starts from the newest usable checkpoint
  policy.on_commit = [this](const checkpoint::CommitInfo& commit) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_.last_checkpoint =
          CheckpointRef{commit.step, checkpoint::KindName(commit.kind), commit.uri, NowMillis()};
    }
    if (options_.observer) options_.observer->OnCheckpoint(commit);
  };
  policy.on_failure = [this](checkpoint::CheckpointKind kind, const Status& why) {
    if (options_.observer) options_.observer->OnCheckpointFailed(kind, why);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.resumed_from.reset();
    state_.skipped_checkpoints.clear();
  }
  policy.on_resume = [this](const checkpoint::ResumeReport& resumed) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const CheckpointRef ref{resumed.step, checkpoint::KindName(resumed.kind), resumed.uri,
                              NowMillis()};
      state_.resumed_from = ref;
      state_.last_checkpoint = ref;  // what the job holds now, whatever came after it
      state_.skipped_checkpoints = resumed.corrupt;
    }
    if (!resumed.corrupt.empty()) {
      LogWarn("resumed from an older checkpoint: newer ones are corrupt",
              {{"step", resumed.step}, {"skipped", resumed.corrupt}});
      if (options_.observer) options_.observer->OnCorruptCheckpointsSkipped(resumed.corrupt.size());
    }
  };
  policy.failures = m.job_restarts;
  policy.generation = m.generation;
  policy.on_interval = [this](const api::IntervalInputs& in, const api::IntervalPlan& plan) {
    std::lock_guard<std::mutex> lock(mu_);
    state_.checkpoint_interval = WorkerState::CheckpointInterval{in, plan};
  };
  policy.live_store = &peer_state_;
  if (!from.peers.empty()) {
    // Every rank was named the peers, so every rank takes part in reading from them (a rank
    // that cannot reach them fails its part, and all go to the store together).
    policy.peer_resume_step = from.step;
    if (!options_.open_peers) {
      LogWarn("no way to reach peers here: resuming from the store", {{"step", from.step}});
    } else if (auto peers = options_.open_peers(from); !peers.ok()) {
      LogWarn("cannot reach the peers: resuming from the store",
              {{"step", from.step}, {"error", peers.status().message()}});
    } else {
      policy.peer_resume = std::move(*peers);
    }
  }
  // Destroyed before the session leaves its group (its writer thread ends first).
  TIDAL_ASSIGN_OR_RETURN(auto hooks, checkpoint::MakeCheckpointHooks(policy, options_.s3));
  Status started = session.Start(*hooks);
  // Every rank of this generation has read what it needed (or given up on it): the previous
  // generation's live checkpoint is of no more use.
  peer_state_.Clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.live_checkpoint.reset();
    state_.held.clear();
  }
  TIDAL_RETURN_IF_ERROR(started);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.step = session.step();
    state_.max_steps = session.max_steps();
    state_.last_error.clear();
    state_.last_error_permanent = false;
    state_.phase = Phase::kRunning;
    changed_.notify_all();
  }
  LogInfo("generation running",
          {{"world_size", m.world_size}, {"resumed_at_step", session.step()}});
  std::unique_ptr<Buddy> buddy;
  if (options_.buddy_every > 0 && m.world_size > 1 && !ring.members.empty() &&
      ring.ward != m.rank && options_.read_peer_object)
    buddy = std::make_unique<Buddy>(*this, m, ring);
  std::unique_ptr<FenceWatch> fence;
  if (m.rank == 0 && m.generation > 0 && !options_.policy.uri.empty()) {
    auto store = objstore::OpenObjectStore(options_.policy.uri, options_.s3);
    if (store.ok()) fence = std::make_unique<FenceWatch>(std::move(*store), m.generation);
  }
  return TrainUntilLeave(session, *hooks, buddy.get(), fence.get());
}

Status WorkerRuntime::TrainUntilLeave(engine::Session& session, engine::TrainingHooks& hooks,
                                      Buddy* buddy, FenceWatch* fence) {
  bool step_first = true;  // false: paused ranks agree on a request at the boundary they hold
  while (true) {
    if (step_first) {
      if (session.step() >= session.max_steps()) {
        TIDAL_RETURN_IF_ERROR(session.Finish(hooks));
        SetPhase(Phase::kSucceeded);
        LogInfo("trained to the last step", {{"step", session.step()}});
        return OkStatus();
      }
      TIDAL_ASSIGN_OR_RETURN(engine::StepRecord record, session.Step());
      PublishStep(record);
      TIDAL_RETURN_IF_ERROR(session.After(hooks));
      if (buddy) TIDAL_RETURN_IF_ERROR(buddy->AfterStep(session, hooks));
    }
    const bool was_held = !step_first;  // agreeing while held: held again after it
    step_first = true;
    uint32_t mine;
    uint64_t mine_id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = requested_;
      mine_id = requested_id_;
    }
    std::optional<int64_t> newer = fence ? fence->Newer() : std::nullopt;
    if (newer) mine |= kSupersededFlag;
    TIDAL_ASSIGN_OR_RETURN(engine::Session::Agreement agreement, session.AgreeFlags(mine, mine_id));
    const uint32_t agreed = agreement.flags;
    if (agreed & kSupersededFlag) {
      const std::string why =
          "superseded: " +
          (newer ? "generation " + std::to_string(*newer) : std::string("a newer generation")) +
          " of this job has started (the checkpoint fence); this one stops at step " +
          std::to_string(session.step()) + " without a checkpoint";
      LogWarn("generation superseded", {{"step", session.step()}, {"why", why}});
      return FailedPrecondition(why);
    }
    if (agreed == 0) {
      if (!was_held) continue;
      SetPhase(Phase::kPaused);  // nothing asked after all: held as before
      if (!StayHeld(step_first)) return OkStatus();
      continue;
    }
    // A live barrier keeps its checkpoint in memory only; anything else that stops the ranks
    // is checkpointed to the store: a pause can last, and leaving (a rescale without a live
    // checkpoint, a shutdown) must lose no step.
    const bool live = agreed & kLiveFlag;
    const bool durable = (agreed & (kCheckpointFlag | kLeaveFlag)) || !live;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Every rank acts on these at this boundary. A request that arrived during the
      // agreement, for flags it carries, belongs to this barrier too: cleared with the rest.
      requested_ &= ~agreed;
      if (requested_ == 0) requested_id_ = 0;
      ++barriers_begun_;
      barrier_flags_ = agreed | (durable ? uint32_t{kCheckpointFlag} : uint32_t{0});
      barrier_id_ = agreement.id;
      state_.phase = Phase::kCheckpointing;
      changed_.notify_all();
      if (options_.hold_barriers_until_request) {
        const uint64_t seen = control_requests_;
        changed_.wait_for(lock, std::chrono::seconds(60),
                          [&] { return control_requests_ > seen || shutdown_; });
      }
    }
    StatusOr<CheckpointRef> result = Aborted("no checkpoint");
    if (durable) {
      auto uri = session.CheckpointNow(hooks);
      result = uri.status();
      if (uri.ok()) result = CheckpointRef{session.step(), "full", *uri, NowMillis()};
    }
    if (live && (!durable || result.ok())) {
      // The live checkpoint replaces everything in memory, buddy copies too: they stop for the
      // rest of the generation (it is about to end).
      if (buddy) buddy->Stop();
      auto uri = session.CheckpointLive(hooks);
      if (!uri.ok()) {
        result = uri.status();
      } else {
        const CheckpointRef ref{session.step(), "live", *uri, NowMillis()};
        if (!durable) result = ref;  // a store checkpoint of the step serves live requests too
        std::lock_guard<std::mutex> lock(mu_);
        state_.live_checkpoint = ref;
        state_.held.clear();
        LogInfo("live checkpoint", {{"step", ref.step}, {"bytes", peer_state_.bytes()}});
      }
    }
    const bool leave = agreed & kLeaveFlag;
    const bool hold = (agreed & kPauseFlag) || was_held;
    EndBarrier(result, hold && !leave);
    TIDAL_RETURN_IF_ERROR(result.status());
    if (leave) return OkStatus();
    if (!hold) {
      SetPhase(Phase::kRunning);
      continue;
    }
    if (!StayHeld(step_first)) return OkStatus();
  }
}

bool WorkerRuntime::StayHeld(bool& step_first) {
  switch (HoldPaused()) {
    case Held::kLeave:
      return false;
    case Held::kAgree:
      step_first = false;
      return true;
    case Held::kResume:
      break;
  }
  SetPhase(Phase::kRunning);
  return true;
}

WorkerRuntime::Held WorkerRuntime::HoldPaused() {
  std::unique_lock<std::mutex> lock(mu_);  // PAUSED since EndBarrier
  // A store checkpoint asked of ranks paused at a live one (a suspend during a live rescale):
  // every member is asked, so all of them come to agree on it.
  const auto store_checkpoint_asked = [&] { return (requested_ & kCheckpointFlag) != 0; };
  changed_.wait(lock, [&] {
    return resume_requested_ || pending_.has_value() || shutdown_ || store_checkpoint_asked();
  });
  if (pending_.has_value() || shutdown_) {
    resume_requested_ = false;
    return Held::kLeave;
  }
  if (resume_requested_) {
    resume_requested_ = false;
    LogInfo("resumed", {{"step", state_.step}});
    return Held::kResume;
  }
  state_.phase = Phase::kCheckpointing;
  changed_.notify_all();
  return Held::kAgree;
}

}  // namespace tidal::worker
