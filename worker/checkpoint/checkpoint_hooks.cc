// worker/checkpoint/checkpoint_hooks.cc — the checkpoints a training run saves on its own
// (TrainingHooks): full and snapshot checkpoints on schedule (a fixed interval, or Young's from
// the measured cost), asynchronously where the spec allows, and a live one at a barrier.
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "common/log.h"
#include "worker/checkpoint/peft_export.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/checkpoint/trainer_checkpoint_internal.h"

namespace tidal::checkpoint {

using engine::Trainer;
using nlohmann::json;
using namespace internal;

namespace {

// Saves asynchronously: at a due step the pieces are copied to host memory and a thread
// builds and writes the shard while training goes on; at each later step boundary the ranks
// ask each other whether every write is done, and once it is, commit it. At most one save is
// in flight (bounded memory): a due save first waits for the previous write to finish.
class CheckpointHooks : public engine::TrainingHooks {
 public:
  // `store` (where saves go) or `resume_store` may be null.
  CheckpointHooks(CheckpointPolicy policy, std::unique_ptr<objstore::ObjectStore> store,
                  std::unique_ptr<objstore::ObjectStore> resume_store)
      : policy_(std::move(policy)),
        store_(std::move(store)),
        resume_store_(std::move(resume_store)) {
    if (store_) {
      repo_.emplace(*store_);
      repo_->SetGeneration(policy_.generation);
    }
  }
  void SetStartFrom(std::unique_ptr<objstore::ObjectStore> store) {
    start_from_store_ = std::move(store);
  }
  ~CheckpointHooks() override {
    if (in_flight_ && in_flight_->thread.joinable()) in_flight_->thread.join();
  }

  Status OnStart(Trainer& trainer) override {
    if (repo_ && !policy_.owner.uid.empty()) {
      const Status claimed = trainer.comm().rank() == 0 ? repo_->Claim(policy_.owner) : OkStatus();
      TIDAL_RETURN_IF_ERROR(AgreeOk(trainer.comm(), claimed, "claiming the checkpoint store"));
    }
    TIDAL_RETURN_IF_ERROR(Resume(trainer));
    if (repo_ && policy_.generation > 0) {
      const Status fenced = trainer.comm().rank() == 0 ? repo_->Fence() : OkStatus();
      TIDAL_RETURN_IF_ERROR(AgreeOk(trainer.comm(), fenced, "raising the checkpoint fence"));
    }
    if (resumed_) {
      // `latest` named a corrupt checkpoint the resume skipped: it names the one resumed now
      // (a failure to write it only leaves the hint stale; the scan is the truth).
      if (resumed_own_ && !resumed_->corrupt.empty() && trainer.comm().rank() == 0)
        if (Status s = repo_->PointLatestAt(resumed_->step); !s.ok())
          Logger::Get().Log("warn", "could not point latest at the resumed checkpoint",
                            {{"step", resumed_->step}, {"error", s.message()}});
      if (policy_.on_resume) policy_.on_resume(*resumed_);
    }
    if (!policy_.auto_full) return OkStatus();
    // What the checkpoint resumed from measured; the first checkpoint of a job measures it.
    const json& carried = trainer.extensions();
    auto cost = carried.find(kCostExtension);
    cost_seconds_ = cost != carried.end() && cost->is_number() ? cost->get<double>() : 0;
    return PlanInterval(trainer, trainer.step());
  }

  // What checkpointing costs the training thread, per save: the host copy, the commit
  // rounds and any wait for the previous write, logged at each commit (bench/checkpoint_stall.sh).
  // With the automatic interval, a periodic full checkpoint's cost from the step it was due at
  // to its commit is C, and its commit plans the next interval.
  Status AfterStep(Trainer& trainer) override {
    const auto start = std::chrono::steady_clock::now();
    const bool full_pending = FullInFlight();
    committed_full_ = -1;
    Status status = SaveIfDue(trainer);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    blocked_seconds_ += elapsed;
    if (!policy_.auto_full || !status.ok()) return status;
    if (full_pending || FullInFlight() || committed_full_ >= 0) full_cost_ += elapsed;
    if (committed_full_ < 0) {
      // A barrier (CheckpointNow, CheckpointLive) committed the pending one between two steps
      // and the generation trains on (a Resume after a pause): plan from it, measuring nothing.
      if (next_full_ != kFullPending || FullInFlight()) return OkStatus();
      full_cost_ = 0;
      return PlanInterval(trainer, std::max<int64_t>(last_full_, 0));
    }
    // A moving average: one slow store round does not swing the interval alone.
    cost_seconds_ = cost_seconds_ > 0 ? 0.5 * cost_seconds_ + 0.5 * full_cost_ : full_cost_;
    full_cost_ = 0;
    trainer.extensions()[kCostExtension] = cost_seconds_;
    return PlanInterval(trainer, committed_full_);
  }

  Status SaveIfDue(Trainer& trainer) {
    if (!repo_) return OkStatus();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/false));
    const int64_t step = trainer.step();
    if (step >= trainer.max_steps() && policy_.save_final) return OkStatus();  // OnFinish saves
    std::optional<CheckpointKind> kind;
    if (FullDue(step))
      kind = CheckpointKind::kFull;
    else if (policy_.snapshot_every > 0 && step % policy_.snapshot_every == 0)
      kind = CheckpointKind::kSnapshot;
    if (!kind) return OkStatus();
    // The automatic interval: no other full checkpoint is due until this one's commit plans
    // the next (AfterStep).
    if (policy_.auto_full && *kind == CheckpointKind::kFull) next_full_ = kFullPending;
    if (!policy_.async) return Save(trainer, *kind).status();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    auto job = std::make_unique<InFlight>();
    auto capture = CaptureForSave(trainer, *kind);
    if (!capture.ok()) {  // still take part in the commit round, so every rank agrees
      job->capture.step = step;
      job->capture.kind = *kind;
      job->shard = capture.status();
      job->done = true;
    } else {
      job->capture = std::move(*capture);
      InFlight* raw = job.get();
      job->thread = std::thread([this, raw] {
        raw->shard = WriteCapture(*repo_, raw->capture);
        raw->done = true;
      });
    }
    in_flight_ = std::move(job);
    return OkStatus();
  }
  Status OnFinish(Trainer& trainer) override {
    if (!repo_) return OkStatus();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    if (!policy_.save_final) return OkStatus();
    TIDAL_RETURN_IF_ERROR(Save(trainer, CheckpointKind::kFull).status());
    if (!policy_.export_final || trainer.comm().rank() != 0) return OkStatus();
    // DESIGN.md §5: the final adapter in PEFT's layout, next to the checkpoints.
    auto exported = ExportPeftAdapter(*repo_, trainer.step(), *store_, kFinalExportPrefix);
    if (!exported.ok()) return exported.status().WithContext("final PEFT export");
    LogInfo("exported the final adapter", {{"uri", store_->uri() + "/" + kFinalExportPrefix},
                                           {"step", exported->step},
                                           {"tensors", exported->tensors},
                                           {"bytes", exported->bytes}});
    return OkStatus();
  }

  StatusOr<std::string> CheckpointLive(Trainer& trainer) override {
    if (!policy_.live_store) return FailedPrecondition("no memory store for live checkpoints");
    // A save still in flight is committed first: its round belongs to this generation.
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    return SaveToPeers(trainer, *policy_.live_store);
  }

  StatusOr<std::function<StatusOr<uint64_t>()>> CheckpointBuddy(Trainer& trainer) override {
    if (!policy_.live_store) return FailedPrecondition("no memory store for buddy copies");
    return CaptureBuddyCopy(trainer, *policy_.live_store);
  }

  StatusOr<std::string> CheckpointNow(Trainer& trainer) override {
    if (!repo_) return FailedPrecondition("no checkpoint URI to save into");
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    if (last_full_ == trainer.step())  // the save just committed is this very step
      return repo_->store().uri() + "/" + StepDirectory(trainer.step());
    return Save(trainer, CheckpointKind::kFull);
  }

 private:
  // The trainer-state extension that carries C across restarts and rescales.
  static constexpr const char* kCostExtension = "checkpointCostSeconds";
  // next_full_ while a full checkpoint of the automatic interval is on its way to its commit.
  static constexpr int64_t kFullPending = std::numeric_limits<int64_t>::max();

  bool FullInFlight() const {
    return in_flight_ && in_flight_->capture.kind == CheckpointKind::kFull;
  }
  bool FullDue(int64_t step) const {
    if (policy_.auto_full) return next_full_ > 0 && step >= next_full_;
    return policy_.full_every > 0 && step % policy_.full_every == 0;
  }

  // Collective: rank 0 plans, every rank takes its plan; the next full checkpoint is due that
  // many steps after `from_step` (the one just committed, or the resumed step), at the next
  // step boundary when that is already past (its commit came later than that).
  Status PlanInterval(Trainer& trainer, int64_t from_step) {
    api::IntervalInputs in;
    in.spec = *policy_.auto_full;
    in.cost_seconds = cost_seconds_;
    // The step time since the last plan (a rescale changes it), else the run's mean.
    const int64_t steps = trainer.step() - planned_at_step_;
    const double seconds = trainer.trained_seconds() - planned_at_trained_;
    in.step_seconds = planned_at_step_ >= 0 && steps > 0 ? seconds / static_cast<double>(steps)
                      : trainer.step() > 0
                          ? trainer.trained_seconds() / static_cast<double>(trainer.step())
                          : 0;
    in.failures = policy_.failures;
    in.trained_seconds = trainer.trained_seconds();
    api::IntervalPlan plan = api::PlanCheckpointInterval(in);
    const bool root = trainer.comm().rank() == 0;
    std::vector<double> agreed = {static_cast<double>(plan.steps),
                                  static_cast<double>(plan.reason),
                                  in.cost_seconds,
                                  in.step_seconds,
                                  in.trained_seconds,
                                  plan.mtbf_seconds,
                                  plan.optimum_seconds,
                                  plan.expected_waste};
    if (!root) std::fill(agreed.begin(), agreed.end(), 0.0);
    TIDAL_RETURN_IF_ERROR(trainer.comm().AllReduceSumHost(agreed));
    plan.steps = static_cast<int64_t>(agreed[0]);
    plan.reason = static_cast<api::IntervalPlan::Reason>(static_cast<int>(agreed[1]));
    in.cost_seconds = agreed[2];
    in.step_seconds = agreed[3];
    in.trained_seconds = agreed[4];
    plan.mtbf_seconds = agreed[5];
    plan.optimum_seconds = agreed[6];
    plan.expected_waste = agreed[7];
    next_full_ = from_step + plan.steps;
    planned_at_step_ = trainer.step();
    planned_at_trained_ = trainer.trained_seconds();
    if (root)
      Logger::Get().Log("info", "checkpoint interval planned",
                        {{"full_every_steps", plan.steps},
                         {"reason", api::ReasonName(plan.reason)},
                         {"next_full_step", next_full_},
                         {"planned_at_step", trainer.step()},
                         {"cost_seconds", in.cost_seconds},
                         {"step_seconds", in.step_seconds},
                         {"mtbf_seconds", plan.mtbf_seconds},
                         {"failures", in.failures},
                         {"trained_seconds", in.trained_seconds},
                         {"expected_waste_percent", 100 * plan.expected_waste}});
    if (policy_.on_interval) policy_.on_interval(in, plan);
    return OkStatus();
  }

  Status Resume(Trainer& trainer) {
    if (resume_store_) {  // asked for by name: it must hold a checkpoint
      Repository from(*resume_store_);
      auto step = ResumeFromNewest(trainer, from);
      if (step.status().code() == StatusCode::kNotFound)
        return NotFound("--resume " + resume_store_->uri() + ": no usable checkpoint there");
      return step.status();
    }
    bool peers_failed = false;
    if (policy_.peer_resume_step > 0) {
      Status live = ResumeFromPeers(trainer, policy_.peer_resume.get(), policy_.peer_resume_step);
      if (live.ok()) return OkStatus();
      // Some rank could not read its part (a peer is gone): every rank knows it (AgreeOk), and
      // the trainer holds a mix of read and initial values, which the store's newest
      // checkpoint overwrites whole.
      peers_failed = true;
      if (trainer.comm().rank() == 0)
        Logger::Get().Log("warn", "live reshard failed, resuming from the store",
                          {{"peers", policy_.peer_resume ? policy_.peer_resume->uri() : ""},
                           {"step", policy_.peer_resume_step},
                           {"error", live.message()}});
    }
    if (!policy_.resume || !repo_) {
      if (peers_failed)
        return Unavailable("the peers' state could not be read and no store to resume from");
      return OkStatus();
    }
    ResumeReport report;
    auto step = ResumeFromNewest(trainer, *repo_, &report);
    if (step.ok()) {
      resumed_ = std::move(report);
      return OkStatus();
    }
    if (step.status().code() == StatusCode::kNotFound) {
      // Starting at step 0 is right for a new job, never over a half-read state.
      if (peers_failed)
        return Unavailable("the peers' state could not be read and " + repo_->store().uri() +
                           " holds no checkpoint to resume from");
      if (start_from_store_) {  // a new job started from another's checkpoints
        Repository from(*start_from_store_);
        auto started = ResumeFromNewest(trainer, from, &report);
        if (started.status().code() == StatusCode::kNotFound)
          return NotFound("spec.checkpoint.resumeFrom: " + start_from_store_->uri() +
                          " holds no usable checkpoint");
        if (!started.ok())
          return started.status().WithContext("spec.checkpoint.resumeFrom " +
                                              start_from_store_->uri());
        if (trainer.comm().rank() == 0)
          LogInfo("started from another job's checkpoint",
                  {{"resume_from", start_from_store_->uri()}, {"step", *started}});
        resumed_ = std::move(report);
        resumed_own_ = false;
        return OkStatus();
      }
      return OkStatus();
    }
    return step.status();
  }
  StatusOr<std::string> Save(Trainer& trainer, CheckpointKind kind) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    auto uri = SaveCheckpoint(trainer, *repo_, kind, policy_.keep, &bytes);
    if (!uri.ok()) {
      Failed(kind, uri.status());
      return uri.status();
    }
    Committed(trainer.step(), kind, start, bytes);
    return uri;
  }
  void Committed(int64_t step, CheckpointKind kind, std::chrono::steady_clock::time_point start,
                 uint64_t shard_bytes) {
    if (kind == CheckpointKind::kFull) last_full_ = committed_full_ = step;
    if (!policy_.on_commit) return;
    CommitInfo info;
    info.step = step;
    info.kind = kind;
    info.uri = repo_->store().uri() + "/" + StepDirectory(step);
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    info.shard_bytes = shard_bytes;
    policy_.on_commit(info);
  }
  void Failed(CheckpointKind kind, const Status& why) {
    if (policy_.on_failure) policy_.on_failure(kind, why);
  }

  struct InFlight {
    SaveCapture capture;
    StatusOr<BuiltShard> shard = Aborted("not written yet");
    std::atomic<bool> done{false};
    std::thread thread;
  };

  // Commits the in-flight save once every rank's write is done (collective: every rank calls
  // it at the same steps). With `wait`, waits for this rank's write first.
  Status Finish(Trainer& trainer, bool wait) {
    if (wait && in_flight_->thread.joinable()) in_flight_->thread.join();
    std::vector<int64_t> pending{in_flight_->done ? 0 : 1};
    TIDAL_RETURN_IF_ERROR(trainer.comm().AllReduceSumHost(pending));
    if (pending[0] > 0) return OkStatus();  // some rank still writing: next step
    if (in_flight_->thread.joinable()) in_flight_->thread.join();
    std::unique_ptr<InFlight> job = std::move(in_flight_);
    Status committed = CommitSave(trainer, *repo_, job->capture, job->shard, policy_.keep);
    if (committed.ok())
      Committed(job->capture.step, job->capture.kind, job->capture.start,
                job->shard.ok() ? job->shard->entry.size : 0);
    else
      Failed(job->capture.kind, committed);
    if (committed.ok()) {
      Logger::Get().Log(
          "info", "checkpoint stall",
          {{"step", job->capture.step}, {"training_thread_seconds", blocked_seconds_}});
      blocked_seconds_ = 0;
    }
    return committed;
  }

  CheckpointPolicy policy_;
  std::unique_ptr<objstore::ObjectStore> store_, resume_store_;
  std::unique_ptr<objstore::ObjectStore> start_from_store_;  // policy_.start_from_uri's
  std::optional<ResumeReport> resumed_;  // this generation's resume from a store, if any
  bool resumed_own_ = true;              // from store_ (not start_from_store_)
  std::optional<Repository> repo_;
  std::unique_ptr<InFlight> in_flight_;
  double blocked_seconds_ = 0;  // in AfterStep since the last commit
  int64_t last_full_ = -1;      // step of the newest full checkpoint this object committed
  // The automatic interval (policy_.auto_full).
  int64_t committed_full_ = -1;   // a full checkpoint this AfterStep committed, of that step
  int64_t next_full_ = 0;         // the step the next full checkpoint is due at (0: none yet)
  double cost_seconds_ = 0;       // C: this rank's moving average (rank 0's is the job's)
  double full_cost_ = 0;          // AfterStep's time while a full checkpoint was pending
  int64_t planned_at_step_ = -1;  // where the last plan measured the step time up to
  double planned_at_trained_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<engine::TrainingHooks>> MakeCheckpointHooks(
    CheckpointPolicy policy, const objstore::S3Options& s3) {
  if (policy.full_every < 0 || policy.snapshot_every < 0)
    return InvalidArgument("checkpoint intervals: expected >= 0");
  if (policy.keep < 1) return InvalidArgument("--keep: expected at least 1");
  if (policy.auto_full) {
    const api::AutoIntervalSpec& a = *policy.auto_full;
    if (a.min_steps < 1 || a.max_steps < a.min_steps)
      return InvalidArgument(
          "automatic checkpoint interval: expected 1 <= minFullEverySteps <= "
          "maxFullEverySteps, got " +
          std::to_string(a.min_steps) + " and " + std::to_string(a.max_steps));
    if (!(a.expected_mtbf_seconds > 0))
      return InvalidArgument("automatic checkpoint interval: expectedMTBF: expected > 0");
    if (policy.failures < 0) return InvalidArgument("restarts: expected >= 0");
  }
  if (policy.uri.empty() && policy.resume_uri.empty())
    return InvalidArgument("checkpoints: expected a checkpoint URI or a URI to resume from");
  std::unique_ptr<objstore::ObjectStore> store, resume_store;
  if (!policy.uri.empty()) {
    TIDAL_ASSIGN_OR_RETURN(store, objstore::OpenObjectStore(policy.uri, s3));
  }
  if (!policy.resume_uri.empty()) {
    auto opened = objstore::OpenObjectStore(policy.resume_uri, s3);
    if (!opened.ok()) return opened.status().WithContext("--resume");
    resume_store = std::move(*opened);
  }
  std::unique_ptr<objstore::ObjectStore> start_from;
  if (!policy.start_from_uri.empty()) {
    auto opened = objstore::OpenObjectStore(policy.start_from_uri, s3);
    if (!opened.ok()) return opened.status().WithContext("spec.checkpoint.resumeFrom");
    start_from = std::move(*opened);
  }
  auto hooks = std::make_unique<CheckpointHooks>(std::move(policy), std::move(store),
                                                 std::move(resume_store));
  hooks->SetStartFrom(std::move(start_from));
  return std::unique_ptr<engine::TrainingHooks>(std::move(hooks));
}

}  // namespace tidal::checkpoint
