// operator/controller/execute.cc — a plan carried out (TrainingJobController::Execute): its API
// writes in order on the api-writes pool after the pass, the status write first; its worker
// calls on their own threads once the status is written.
#include <type_traits>

#include "common/log.h"
#include "operator/controller/controller_internal.h"
#include "operator/controller/metrics.h"

namespace tidal::controller {

using nlohmann::json;
using shell::Key;
using shell::ResourceVersion;
using shell::RetryMeetsAgain;

namespace {

// The actions that call workers; the others write API objects (Execute runs those after the
// pass, in order).
bool IsWorkerCall(const Action& a) {
  return std::visit(
      [](const auto& kind) {
        using K = std::decay_t<decltype(kind)>;
        return std::is_same_v<K, action::Barrier> || std::is_same_v<K, action::Rendezvous> ||
               std::is_same_v<K, action::PrepareEngine> || std::is_same_v<K, action::Shutdown> ||
               std::is_same_v<K, action::Resume>;
      },
      a);
}

}  // namespace

Status TrainingJobController::Execute(const json& job, const Observed& o, const Plan& plan,
                                      WorkerConnections& connections,
                                      std::optional<kube::Request> status_write,
                                      std::shared_ptr<const Landing> landing, bool* wrote) {
  const std::string job_key = Key(o.namespace_, o.name);
  // The job's resourceVersion when the plan's writes run: the status write's, once made.
  auto version = std::make_shared<std::string>(ResourceVersion(job));
  // The API writes of an earlier plan, ended (Reconcile decides nothing while they run). One
  // that failed fails this pass if it writes too, as it would have failed the pass that planned
  // it (an Event and Ready=False for an error a retry would meet again; a retry with backoff);
  // a plan that writes nothing any more (the pods came, the job was suspended) leaves it.
  // (A status write that failed for a reason a retry meets again — refused, not a conflict —
  // fails a pass that writes the status again.)
  if (std::shared_ptr<WorkerConnections::Writes> w = connections.writing) {
    std::optional<Status> result;
    bool status_failed = false;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      result = w->result;
      status_failed = w->status_failed;
    }
    connections.writing.reset();
    const bool writes_again =
        (status_failed && status_write && result && RetryMeetsAgain(*result)) ||
        std::any_of(plan.actions.begin(), plan.actions.end(),
                    [](const Action& a) { return !IsWorkerCall(a); });
    if (result && !result->ok() && writes_again) return *result;
  }
  // The plan's actions, collected in its order: worker calls (`starts`) and API writes. One
  // that fails ends the loop; what was collected before it is done (as it was done before it).
  PlanExecutor executor(*this, job, o, plan, connections, version);
  Status acted = OkStatus();
  for (const Action& a : plan.actions) {
    if (Status done = std::visit(executor, a); !done.ok()) {
      LogWarn("action failed",
              {{"job", o.name}, {"action", ActionName(a)}, {"error", done.ToString()}});
      acted = done.WithContext(ActionName(a));
      break;
    }
  }
  std::vector<std::function<void()>> starts = std::move(executor.starts);
  std::vector<PlanExecutor::Write> writes = std::move(executor.writes);
  if (!status_write) {
    // Nothing to write first: the plan lands and its worker calls start now.
    Land(*landing, job);
    for (auto& s : starts) s();
    if (writes.empty()) return acted;
  }
  // In order, the first failure ending them, on api_writes_: a slow API server holds no
  // reconcile (the status write, creating a job's pods and updating its spec's ConfigMap were
  // the slow passes at 200 jobs). Their end wakes the job.
  auto batch = std::make_shared<WorkerConnections::Writes>();
  connections.writing = batch;
  *wrote = true;
  const bool api_writes = !writes.empty(), pass_ok = acted.ok();
  const auto submitted = std::chrono::steady_clock::now();
  api_writes_.Submit([this, batch, job_key, version, api_writes, pass_ok, submitted,
                      landing = std::move(landing), status_write = std::move(status_write),
                      starts = std::move(starts), writes = std::move(writes)]() mutable {
    // Whatever ends them (one that throws: no thread for a side-by-side creation, say) ends
    // them like a failure; the result is always set, or the job's passes would wait forever.
    auto run = [](const std::function<Status()>& step) -> Status {
      try {
        return step();
      } catch (const std::exception& e) {
        return Internal(std::string("threw: ") + e.what());
      } catch (...) {
        return Internal("threw an unknown exception");
      }
    };
    Status result = OkStatus();
    bool status_failed = false;
    if (status_write) {
      result = run([&]() -> Status {
        const std::string before = *version;
        auto written = client_.Call(*status_write);
        if (!written.ok()) {
          status_failed = true;
          return written.status().WithContext("writing status");
        }
        *version = ResourceVersion(*written);
        auto ptr = std::make_shared<const json>(std::move(*written));
        if (*version != before) RememberOwnWrite(job_key, landing->cached_version, ptr);
        Land(*landing, *ptr);
        for (auto& s : starts) s();
        return OkStatus();
      });
      if (!result.ok())
        LogWarn("status write failed", {{"job", job_key}, {"error", result.ToString()}});
    }
    for (const PlanExecutor::Write& w : writes) {
      if (!result.ok()) break;
      if (Status s = run(w.call); !s.ok()) {
        LogWarn("action failed", {{"job", job_key}, {"action", w.action}, {"error", s.ToString()}});
        result = s.WithContext(w.action);
      }
    }
    if (OperatorMetrics* m = options_.metrics)
      m->ObservePlanWrites(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count(),
          result.ok());
    bool deferred = false;
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      batch->result = result;
      batch->status_failed = status_failed;
      deferred = batch->deferred;
    }
    // A failure's retry backs off (the pass that reads it returns it, and requeues with backoff
    // again).
    if (!result.ok()) {
      queue_.AddRateLimited(job_key);
      return;
    }
    // A plan whose pass went well and whose writes all landed ends a streak of failures, and
    // the Ready=False that streak left (as Work does after a pass that writes nothing).
    bool was_failing = false;
    if (pass_ok) {
      queue_.Forget(job_key);
      std::lock_guard<std::mutex> lock(connections_mu_);
      if (auto it = connections_.find(job_key); it != connections_.end())
        was_failing = std::exchange(it->second->reconcile_failing, false);
    }
    // What the API writes made wakes the job through its informer's event, once the cache has
    // it (a wake now would beat the pods into the cache and plan them again); a second later is
    // only the look for a write that changed nothing. A status write alone changes nothing the
    // next pass would plan again: a pass it held back (or the one that writes the job's own
    // Ready) runs now.
    if (api_writes)
      queue_.AddAfter(job_key, std::chrono::seconds(1));
    else if (deferred || was_failing)
      queue_.Add(job_key);
  });
  return acted;
}

}  // namespace tidal::controller
