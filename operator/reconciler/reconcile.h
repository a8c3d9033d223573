// operator/reconciler/reconcile.h — what the controller does next for one TrainingJob, as a
// pure function of what it observes: the job (spec, status, deletion), the children it owns,
// its worker pods, what each reachable worker reports over gRPC, the cluster's idle GPUs and
// the time. No I/O: the controller's shell (controller.h) observes, calls Decide, writes the
// status first and then carries out the actions, each idempotent. Every step of DESIGN.md §4
// is recorded in status before it is acted on, so a new leader that finds a half-done rescale
// or recovery carries it on from the status alone — never two generations training at once.
//
// The rescale protocol, make before break:
//   WaitingForPods  new pods of the next generation created together (one gang group);
//                   training goes on. Not all reachable within scaleUpTimeoutSeconds:
//                   they are deleted, an Event says why, the job stays as it was. Once they
//                   are, every member of the next generation is asked to get ready for its
//                   planned rank (PrepareEngine: a new worker loads its engine, a current one
//                   reads the base weights its new shard adds) and the job trains on until
//                   each reports it ready, failed, or scaleUpTimeoutSeconds more have passed.
//                   A scale-down starts here too (no pods to wait for); a drain does not wait.
//   Barrier         Checkpoint{pause} on every member: all pause at one step, checkpointed.
//   Rendezvous      status.generation + 1 and the new members written, then Rendezvous on
//                   each new member (rank order = member order); surplus ranks Shutdown and
//                   their pods deleted. Done when every member reports the new generation.
// Drain: a member whose pod is being deleted (an eviction, `kubectl drain`, `kubectl delete pod`)
// or whose node is cordoned or tainted NoExecute, while its worker still trains, is moved off
// live: a scale-down without it when the rest is an allowed size (its GPUs come back elsewhere
// by a scale-up), else replacements first, make before break. Its worker trains on after its
// SIGTERM until the Shutdown that ends the move (TIDAL_DRAIN_SECONDS): no step is lost.
// Recovery: a member pod that failed, vanished, or reports FAILED ends the generation. The
// restart is counted (Failed beyond maxRestarts), the failed pods are deleted, and after the
// backoff (backoffSeconds × 2^(restarts-1), at most 10 minutes) the survivors plus
// replacements (or the survivors alone when that is ≥ minGPUs) rendezvous as a new
// generation, resuming from the newest checkpoint.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/training_job.h"
#include "api/worker_phase.h"
#include "common/status.h"
#include "kube/types.h"
#include "operator/planner/anomaly.h"
#include "operator/planner/buddy.h"
#include "operator/planner/lifecycle.h"
#include "operator/planner/share.h"
#include "operator/reconciler/action.h"

namespace tidal::reconciler {

using Clock = std::chrono::system_clock;

inline constexpr const char* kFinalizer = "tidal.dev/final-checkpoint";

// The protocol state the controller keeps in status (beside what it reports).
struct RescaleState {
  enum class Stage { kWaitingForPods, kBarrier, kRendezvous };
  Stage stage = Stage::kWaitingForPods;
  int64_t target_generation = 0;
  std::vector<std::string> members;   // the next generation's pods, rank order
  std::vector<std::string> new_pods;  // created for it (deleted if abandoned)
  std::string reason;                 // "scale 2 -> 4 GPUs: schedule window night"
  Clock::time_point started;
  bool recovery = false;  // a recovery's rendezvous (no barrier: the old generation is gone)
  // A move off members that must leave (their pod is being deleted, or their node cordoned or
  // tainted NoExecute) while their workers still train: live, and it starts no cooldown.
  bool drain = false;
  // WaitingForPods: the pods not ready yet and why ("job-worker-2 (Pending: Unschedulable)",
  // "job-worker-0 (Running; worker does not answer: ...)"), as of the last reconcile.
  std::string waiting_for;
  // A live rescale (DESIGN.md §4 step 5): the previous generation's pods, rank order, each
  // holding its part of the live checkpoint of `state_step` in memory. The new generation reads
  // it from them; they are shut down once it runs. Empty: the store's checkpoint.
  std::vector<std::string> state_peers;
  int64_t state_step = 0;
  // kRendezvous: per rank, the rank whose buddy copy it keeps (planner::BuddyWards).
  std::vector<int> wards;
  // WaitingForPods: when the new workers were asked to prepare their engines (once).
  std::optional<Clock::time_point> prepare_asked;
  // kBarrier: since when (ReconcileOptions::barrier_timeout).
  std::optional<Clock::time_point> barrier_started;
};

// status.anomaly: the anomaly rule's state (only while spec.anomaly is set).
struct AnomalyStatus {
  std::string rule;             // planner::DescribeRule for what the workers report
  int64_t checked_step = 0;     // the newest step the rule has seen
  std::optional<int64_t> step;  // the last step of the newest rise found
  std::string message;
  std::optional<Clock::time_point> time;
  bool paused = false;  // action Pause took effect; waits for acknowledgedStep >= step
};

// status.data: the data phase. Before a job's first generation (and again after an edit of
// spec.model, spec.dataset or spec.lora), a prep pod runs `tidal-prep --config` on no GPU: it
// tokenizes spec.dataset.uri's JSONL into a token store (a no-op when that store exists, or
// when the uri names a store) and checks the spec against the model (tokenizer, maxSeqLen,
// LoRA rank). Its outcome comes back as its termination message. Workers are created only
// after it, told the store (TIDAL_DATASET_STORE).
enum class DataPhase {
  kPreparing,  // its prep pod runs
  kReady,      // the token store is there: workers may start
  kInvalid,    // the spec must change (tidal-prep refused it)
  kRetrying,   // its prep pod failed for another reason: another after a backoff
};
const char* DataPhaseName(DataPhase phase);
// "one of Preparing, Ready, Invalid, Retrying" when `name` is none of them.
StatusOr<DataPhase> DataPhaseFromName(const std::string& name);

struct DataStatus {
  std::string key;  // DataKey of the spec it was run for
  DataPhase phase = DataPhase::kPreparing;
  std::string pod;  // the prep pod
  std::string store_uri;
  int64_t samples = 0, tokens = 0;
  bool reused = false;   // the store existed already
  std::string message;   // the outcome, or the error
  int64_t failures = 0;  // prep pods that failed (not on the spec) for this key
  std::optional<Clock::time_point> started, retry_not_before;
};

// One of status.conditions (metav1.Condition).
// The condition types the operator writes on a TrainingJob (status.conditions[].type), as
// `kubectl wait --for=condition=…` names them.
enum class ConditionType {
  kReady,
  kProgressing,
  kScaling,
  kRecovering,
  kStalled,
  kDataReady,
  kLossAnomaly,
  kCheckpointsIntact,
  kScaleOverride,
};
const char* ConditionTypeName(ConditionType type);

// metav1.ConditionStatus.
enum class ConditionStatus { kTrue, kFalse, kUnknown };
const char* ConditionStatusName(ConditionStatus status);

struct Condition {
  std::string type;  // ConditionTypeName
  ConditionStatus status = ConditionStatus::kUnknown;
  std::string reason, message;
  Clock::time_point last_transition_time;
  int64_t observed_generation = 0;
  bool operator==(const Condition&) const = default;
};
nlohmann::json ToJson(const std::vector<Condition>& conditions);
// Strict, as the rest of the status: a missing type, a status other than True, False or
// Unknown, or a field of the wrong type is an error naming it (status.conditions[2].status).
StatusOr<std::vector<Condition>> ConditionsFromJson(const nlohmann::json& conditions);

struct JobStatus {
  planner::Phase phase = planner::Phase::kPending;
  int64_t generation = 0;
  std::vector<std::string> members;  // current generation's pods, rank order
  std::optional<RescaleState> rescale;
  int64_t restarts = 0;
  // Restarts of the current streak (each less than 10 minutes after the one before): the
  // backoff's exponent.
  int64_t restart_streak = 0;
  std::optional<Clock::time_point> restart_not_before;  // recovery backoff
  std::optional<Clock::time_point> last_membership_change;
  // After an abandoned scale-up, no new one before this (max(cooldown, scale-up timeout)).
  std::optional<Clock::time_point> scale_up_not_before;
  int64_t step = 0;
  double loss = 0, tokens_per_second = 0;
  nlohmann::json last_checkpoint;  // {step, kind, uri, time} or null
  // spec.checkpoint.fullEverySteps auto: rank 0's plan (interval_json.h), or null.
  nlohmann::json checkpoint_interval;
  int64_t desired_gpus = 0, current_gpus = 0;
  std::string gpus_reason;
  std::string failure;  // why the job failed, for the condition
  // RestartsExhausted (final) or ConfigurationError (a worker could not use the spec of
  // metadata.generation failed_spec_generation; an edit retries).
  std::string failure_reason;
  int64_t failed_spec_generation = 0;
  std::string last_failure;  // the newest cause a restart was tried for
  std::optional<Clock::time_point> last_failure_time;
  std::optional<AnomalyStatus> anomaly;
  std::optional<DataStatus> data;
  std::vector<Condition> conditions;
  int64_t observed_generation = 0;
};
// Whether the status has the condition `type` with status "True".
bool ConditionTrue(const JobStatus& status, ConditionType type);
// Ready=False, reason ReconcileError: a reconcile of this job failed inside the operator (the
// operator goes on with every other job and retries this one with backoff).
void MarkReconcileError(JobStatus& status, const std::string& message, Clock::time_point now,
                        int64_t observed_generation);
// Strict: an absent field takes its default, a present one of the wrong type is an error
// naming it.
StatusOr<JobStatus> JobStatusFromJson(const nlohmann::json& status);
// The status subresource body; `label_selector` is written for the scale subresource.
nlohmann::json ToJson(const JobStatus& status, const std::string& label_selector);

// The newest step figures of a job: its rank 0's, at the newest generation it reports, as it
// pushes them while it trains (StatusFeed). The controller's patcher writes them to status
// between reconciles.
struct StepFigures {
  int64_t generation = 0, step = 0;
  double loss = 0, tokens_per_second = 0;
  // The newest committed checkpoint rank 0 reports (-1: none).
  int64_t checkpoint_step = -1;
  std::string checkpoint_kind, checkpoint_uri;
  nlohmann::json checkpoint_interval;  // status.checkpointInterval, or null (interval_json.h)
  bool operator==(const StepFigures&) const = default;
};
// The merge patch that brings the cached job's status up to `figures` (null: nothing to
// write). Only onto a status that trains (Running, Scaling), and only forward: a step past
// status.step, a checkpoint past status.lastCheckpoint's step. Rank 0's figures stop where it
// last trained: a drain's checkpoint, written by the reconcile from the paused workers'
// answers, is newer than anything they hold. The patch carries the cached resourceVersion as
// its precondition, so a status the cache has not caught up with (a reconcile's write) is
// refused with a Conflict rather than overwritten.
std::optional<nlohmann::json> FiguresPatch(const nlohmann::json& cached_job,
                                           const StepFigures& figures, Clock::time_point now);
// The fields of status that only report the workers' progress (StepFigures): step, loss,
// tokensPerSecond, lastCheckpoint, checkpointInterval.
nlohmann::json WithoutFigures(nlohmann::json status);
// Whether job `after` differs from `before` in nothing but its resourceVersion, managedFields
// and the figures in status: a change that asks for no reconcile (the patcher's).
bool OnlyFiguresChanged(const nlohmann::json& before, const nlohmann::json& after);

// A worker's answer to GetStatus (worker/control's proto, without protobuf types).
struct WorkerReport {
  api::WorkerPhase phase = api::WorkerPhase::kWaiting;
  int64_t generation = 0;
  int rank = 0, world_size = 0;
  int64_t step = 0;
  double loss = 0, tokens_per_second = 0;
  std::optional<int64_t> checkpoint_step;
  std::string checkpoint_kind, checkpoint_uri;
  nlohmann::json checkpoint_interval;  // its automatic checkpoint interval, or null
  std::optional<int64_t> live_step;    // the live checkpoint it holds in memory, if any
  std::string last_error;
  bool last_error_permanent = false;              // the spec must change before a restart can help
  std::optional<double> gpu_utilization_percent;  // none on CPU workers
  std::vector<planner::StepSample> recent_steps;  // the newest steps, for the anomaly rule
  std::vector<planner::HeldPartView> held;        // buddy copies it holds in memory
  // Its engine prepared ahead of its first generation (worker.proto PreparedEngine).
  struct Prepared {
    int64_t generation = 0;
    int rank = 0, world_size = 0;
    bool ready = false;
    std::string error;
  };
  std::optional<Prepared> prepared;
  // The store checkpoint its generation resumed from (worker.proto resumed_from), and the newer
  // ones that resume skipped as corrupt.
  std::optional<int64_t> resumed_from_step;
  std::string resumed_from_uri;
  std::vector<std::string> skipped_checkpoints;
};

struct PodView {
  std::string name;
  int slot = 0;
  kube::PodPhase phase = kube::PodPhase::kPending;
  bool ready = false;
  bool deleting = false;
  std::string ip;
  int64_t created_for_generation = 0;
  std::string reason;  // why it is not running (Unschedulable, the exit code, ...)
  std::string node;    // spec.nodeName
  // Its node is gone or its Ready condition is not True: its kubelet answers nothing.
  bool node_lost = false;
  // Why its node wants it gone though it runs ("" when not): "node n1 is cordoned", "node n1
  // has taint k=v:NoExecute" (one the pod does not tolerate, or only for tolerationSeconds).
  std::string node_notice;
  std::optional<Clock::time_point> deletion_deadline;  // metadata.deletionTimestamp
};

// The prep pod of the data phase (label tidal.dev/role=prep), apart from the workers.
struct PrepPodView {
  std::string name;
  kube::PodPhase phase = kube::PodPhase::kPending;
  bool deleting = false;
  std::string message;  // the container's termination message (tidal-prep --result)
  std::string reason;   // why it is not running, as for a worker
};

struct Observed {
  std::string name, namespace_, uid;
  int64_t metadata_generation = 0;
  bool deleting = false;
  std::optional<Clock::time_point> deletion_started;  // metadata.deletionTimestamp
  bool has_finalizer = false;
  StatusOr<api::TrainingJobSpec> spec = Internal("not observed");
  // Why spec.replicas was left out of `spec` (api::ParseManagedJobSpec; "" when it was not).
  std::string refused_replicas;
  nlohmann::json raw_spec;
  JobStatus status;
  // Why the status subresource does not read ("" when it does). `status` then holds only its
  // conditions, when those read.
  std::string status_error;
  // A pass over the job failed with an error a retry meets again, and none has succeeded since:
  // the Ready=False (ReconcileError) the shell wrote then stands.
  bool reconcile_failing = false;
  bool service_exists = false, token_exists = false, spec_config_exists = false;
  std::vector<PodView> pods;  // the workers
  std::vector<PrepPodView> prep_pods;
  std::map<std::string, WorkerReport> reports;  // by pod name: the reachable workers
  // Pods whose worker did not answer, since when (the shell remembers across reconciles).
  std::map<std::string, Clock::time_point> unreachable_since;
  std::map<std::string, std::string> unreachable_error;  // why, for status.rescale.waitingFor
  // How long every worker has answered "training" without the step moving (the shell
  // measures it on its monotonic clock; zero while any worker does something else).
  std::chrono::seconds no_progress_for{0};
  // The followed workers push their status (a live WatchStatus stream, StatusFeed): any change
  // of theirs wakes the job, so a steady one needs no poll. Every member is followed, except
  // while the job is steady: then only its rank 0 (Plan::steady).
  bool pushed = false;
  int64_t idle_gpus = 0;  // the capacity gate's input
  // The job's share of the cluster's GPUs among every job and the pods it yields to
  // (planner/share.h); none where the shell shares nothing (a job it does not index yet).
  std::optional<planner::Share> share;
  Clock::time_point now;
};

// Observed::no_progress_for, kept by the shell across passes on its monotonic clock: how long
// every live worker pod has answered "training" at one generation with the newest step
// unchanged. Zero on a pass where that does not hold or the step moved.
class ProgressClock {
 public:
  std::chrono::seconds Observe(const std::vector<PodView>& pods,
                               const std::map<std::string, WorkerReport>& reports,
                               std::chrono::steady_clock::time_point now);

 private:
  int64_t generation_ = -1, step_ = -1;
  std::chrono::steady_clock::time_point since_;
};

struct Event {
  std::string type;  // Normal | Warning
  std::string reason, message;
};

// One change of status.phase a pass made, through the transition table (planner/lifecycle.h).
struct PhaseChange {
  planner::Phase from = planner::Phase::kPending, to = planner::Phase::kPending;
  planner::Event event = planner::Event::kWorkersReady;
  std::string reason;
  // The table does not allow it: the phase stayed `from`. A bug in Decide (the simulator's
  // scenarios assert there is none); the shell logs it as an error.
  bool refused = false;
};

struct Plan {
  JobStatus status;                        // written (if changed) before any action runs
  std::vector<PhaseChange> phase_changes;  // in the order the pass made them
  std::vector<Action> actions;
  std::vector<Event> events;
  // Look again after this long at the latest (worker progress, schedule windows, backoff).
  std::chrono::milliseconds requeue_after{std::chrono::seconds(5)};
  // Set by the pass that sees a rescale through (every member on the new generation), for
  // the rescale duration metric: "start" (the first generation), "resume" (after suspend),
  // "scale_up", "scale_down" or "recovery", and when it began.
  struct FinishedRescale {
    std::string kind;
    Clock::time_point started;
  };
  std::optional<FinishedRescale> finished_rescale;
  // Write status.conditions alone (a merge patch), leaving every other field as it is: the
  // status does not read, and what it holds is the evidence a person needs.
  bool conditions_only = false;
  // Nothing to change, every member running and pushing (Decider::Steady): the shell then
  // follows the job's rank 0 alone until a pass finds it otherwise. A peer that fails or
  // freezes stops rank 0's collectives, which rank 0 pushes (an error, after the group's
  // timeout at the latest); a peer's pod that ends wakes the job through the pod informer.
  bool steady = false;
};

struct ReconcileOptions {
  // A member that does not answer for this long counts as failed.
  std::chrono::seconds unreachable_after{30};
  // A checkpoint barrier every member has not reached in this long (a step that does not end,
  // a rank that does not answer) is given up: a rescale's is abandoned (BarrierTimedOut), its
  // new pods deleted; a deletion's final checkpoint is skipped (the newest existing one stays).
  std::chrono::seconds barrier_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds poll{std::chrono::seconds(2)};
};

// Observed::status (and status_error) from the status subresource. A status that does not
// read leaves only its conditions, when those read: nothing is decided from it (Decide holds
// the job), and it is never replaced by defaults.
void ObserveStatus(const nlohmann::json& raw, Observed& o);

Plan Decide(const Observed& observed, const ReconcileOptions& options = {});

const char* StageName(RescaleState::Stage stage);

}  // namespace tidal::reconciler
