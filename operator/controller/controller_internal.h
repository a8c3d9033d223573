// operator/controller/controller_internal.h — what the files of TrainingJobController's shell
// share, and nothing else includes: the records a pass leaves for the next ones (the asks it
// waits for, its API writes, what lands with its status write) and a few helpers.
//   controller.cc     the loop: informers, queue, a pass (Reconcile), own-write tracking
//   observe.cc        what a pass sees: the job, its pods and nodes, the workers' answers
//   capacity.cc       the GPU capacity index (held, booked, idle) and the decision over it
//   execute.cc        a plan carried out: API writes in order, worker calls on their threads
//   plan_executor.cc  each kind of action turned into an API write or a worker call
//   status_writes.cc  the status write of a pass, what lands with it, the figures' patcher
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "contract/worker_status.h"
#include "kube/request.h"
#include "kube/types.h"
#include "operator/controller/controller.h"
#include "operator/controller/metrics.h"
#include "operator/reconciler/action.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/event_reason.h"
#include "operator/reconciler/reconcile.h"

namespace tidal::controller {

// The reconciler's vocabulary (operator/reconciler, namespace tidal::reconciler), which the
// shell's files carry out: what a pass observes, the plan it gets back and its actions.
namespace action = reconciler::action;
using reconciler::Action;
using reconciler::ActionName;
using reconciler::Clock;
using reconciler::ConditionType;
using reconciler::Event;
using reconciler::EventReason;
using reconciler::EventReasonName;
using reconciler::JobRef;
using reconciler::Observed;
using reconciler::PhaseChange;
using reconciler::Plan;
using reconciler::PodView;

// The asks a pass that decided nothing waits for (Observe): the last to end wakes the job, so
// that ten members answering one after another run one pass, not ten. One reference is the
// pass's own until it has counted them all (one that ended meanwhile is then not counted).
struct TrainingJobController::WorkerConnections::Awaited {
  std::atomic<int> pending{1};
};

// A worker's GetStatus, asked by a pass (Observe): its answer, once it came, is read by a later
// one.
struct TrainingJobController::WorkerConnections::Ask {
  std::mutex mu;
  std::chrono::steady_clock::time_point asked;
  // Guarded by mu:
  std::optional<StatusOr<contract::WorkerStatus>> answer;
  std::chrono::steady_clock::time_point answered;
  bool wake_on_failure = false;      // else only an answer wakes the job
  std::shared_ptr<Awaited> awaited;  // a pass waits for it: the last one's end wakes the job
};

// The API writes of a plan (Execute): the outcome, once the last one returned or one failed.
struct TrainingJobController::WorkerConnections::Writes {
  std::mutex mu;
  std::optional<Status> result;  // guarded by mu
  bool status_failed = false;    // the failure was the status write's (guarded by mu)
  bool deferred = false;         // a pass found them running and decided nothing (guarded by mu)
};

struct TrainingJobController::Landing {
  std::string key, namespace_, name;
  // The version the jobs cache held when the pass began: what its status write replaces in the
  // cache's eyes (RememberOwnWrite).
  std::string cached_version;
  std::vector<PhaseChange> phase_changes;
  OperatorMetrics::JobFigures figures;
  bool restarted = false;
  bool corrupt_resume = false;  // a resume skipped corrupt checkpoints (a CorruptCheckpoint Event)
  std::optional<std::pair<std::string, double>> rescale;  // its kind, the seconds it took
  std::vector<Event> events;
};

// The visitor over a plan's actions (std::visit(executor, action), in the plan's order):
// each kind becomes API writes, run in order after the pass (`writes`), or worker calls,
// started once the status is written (`starts`). An overload returns what stops the plan
// there: a request that cannot be built, a TLS Secret that cannot be used. A new kind of
// action (action.h) needs its overload here, or std::visit does not compile.
class TrainingJobController::PlanExecutor {
 public:
  struct Write {
    const char* action;  // its kind's name, for the log and the error's context
    std::function<Status()> call;
  };
  // `version`: the job's resourceVersion when the writes run (the status write's, once made).
  PlanExecutor(TrainingJobController& controller, const nlohmann::json& job, const Observed& o,
               const Plan& plan, WorkerConnections& connections,
               std::shared_ptr<std::string> version);

  Status operator()(const action::AddFinalizer&) { return Finalizer(/*add=*/true); }
  Status operator()(const action::RemoveFinalizer&) { return Finalizer(/*add=*/false); }
  Status operator()(const action::EnsureService&);
  Status operator()(const action::EnsureTokenSecret&);
  Status operator()(const action::EnsureSpecConfig&);
  Status operator()(const action::UpdateSpecConfig&);
  Status operator()(const action::CreatePods& a);
  Status operator()(const action::DeletePods& a) { return Delete(a.pods, /*force=*/false); }
  Status operator()(const action::ForceDeletePods& a) { return Delete(a.pods, /*force=*/true); }
  Status operator()(const action::CreatePrepPod& a);
  Status operator()(const action::Barrier& a);
  Status operator()(const action::Rendezvous& a);
  Status operator()(const action::PrepareEngine& a);
  Status operator()(const action::Shutdown& a);
  Status operator()(const action::Resume& a);

  std::vector<Write> writes;
  std::vector<std::function<void()>> starts;

 private:
  Status Finalizer(bool add);
  Status Delete(const std::vector<std::string>& pods, bool force);
  // Creates the object; one that is already there is success.
  std::function<Status()> Create(kube::Resource r, nlohmann::json object) const;
  std::function<Status()> Call(kube::Request request) const;
  std::string PodIp(const std::string& pod) const;
  // The pod's worker client: nullptr when the pod has no IP yet, or (an error in *unusable)
  // when the job's TLS Secret is unusable.
  std::shared_ptr<contract::WorkerApi> WorkerOf(const std::string& pod, Status* unusable);
  // A worker call, started on its own thread (WorkerCalls) once the status is written: once
  // per pod and `what` while it runs; its failure is logged and, with `wake`, its end
  // reconciles the job again.
  void Start(const std::string& pod, const std::string& what, std::function<Status()> call,
             bool wake);

  TrainingJobController& c_;
  const nlohmann::json& job_;
  const Observed& o_;
  const Plan& plan_;
  WorkerConnections& connections_;
  std::shared_ptr<std::string> version_;
  const JobRef ref_;
  const std::string token_, job_key_;
};

namespace shell {

inline std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }

inline std::string ResourceVersion(const nlohmann::json& object) {
  auto md = object.find("metadata");
  if (md == object.end() || !md->is_object()) return "";
  auto v = md->find("resourceVersion");
  return v != md->end() && v->is_string() ? v->get<std::string>() : "";
}

// An error a retry would meet again: an exception, an object the API server refuses (400/422),
// an answer nobody expected. Conflicts, an unreachable API server and the workers' answers
// mid-transition (a barrier to a rank that just failed) pass with a requeue.
inline bool RetryMeetsAgain(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kInternal ||
         s.code() == StatusCode::kDataLoss;
}

// A node whose Ready condition is there and not True (Unknown: its kubelet stopped posting;
// False: it reports itself unhealthy). A node without the condition yet is taken as it is.
bool NodeSilent(const kube::Node& node);
// Why the pod's node wants it gone though it still runs it ("" when not): cordoned (`kubectl
// cordon`, the first step of `kubectl drain`), or tainted NoExecute with a taint the pod does
// not tolerate for good (the taint manager evicts it, at once or after tolerationSeconds).
std::string NodeNotice(const std::vector<kube::PodToleration>& tolerations, const kube::Node& node);

}  // namespace shell
}  // namespace tidal::controller
