// operator/controller/status_writes.cc — the status write of a pass (StatusWrite, WriteStatus),
// what lands with it (Land: phase logs, metrics, Events), and the patcher that writes the
// workers' step figures between passes (PatchFigures).
#include <malloc.h>

#include <future>

#include "common/log.h"
#include "operator/controller/controller_internal.h"
#include "operator/controller/metrics.h"
#include "operator/reconciler/children.h"

namespace tidal::controller {

using nlohmann::json;
using reconciler::FiguresPatch;
using reconciler::JobLabelValue;
using reconciler::kJobLabel;
using reconciler::ToJson;
using reconciler::WithoutFigures;
using shell::ResourceVersion;

void TrainingJobController::PatchFigures() {
  // A step waits at most a tick for its write (and a job's writes are a second apart); the
  // streams are swept for silence every second, the allocator trimmed every ten seconds.
  constexpr auto kTick = std::chrono::milliseconds(100);
  constexpr auto kPerJob = std::chrono::seconds(1);
  constexpr auto kSweepEvery = std::chrono::seconds(1);
  constexpr auto kTrimEvery = std::chrono::seconds(10);
  auto swept = std::chrono::steady_clock::now(), trimmed = swept;
  std::unique_lock<std::mutex> lock(patcher_mu_);
  while (!patcher_cv_.wait_for(lock, kTick, [&] { return patcher_stop_; })) {
    lock.unlock();
    if (const auto t = std::chrono::steady_clock::now(); t - swept >= kSweepEvery) {
      feed_.Sweep();
      swept = t;
    }
    if (const auto t = std::chrono::steady_clock::now(); t - trimmed >= kTrimEvery) {
      // What a start-up of hundreds of pods freed goes back to the system: glibc keeps freed
      // pages inside its heaps resident until asked.
      malloc_trim(0);
      trimmed = t;
    }
    for (const auto& [job, figures] : feed_.TakeChangedFigures()) {
      Patched& p = patched_[job];
      if (figures.step > p.figures.step || figures.generation != p.figures.generation ||
          figures.checkpoint_uri != p.figures.checkpoint_uri) {
        p.figures = figures;
        p.pending = true;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    struct Write {
      std::string job, ns, name, version;
      int64_t step;
      std::future<StatusOr<json>> done;
    };
    std::vector<Write> writes;
    for (auto it = patched_.begin(); it != patched_.end();) {
      const std::string& job = it->first;
      Patched& p = it->second;
      const auto slash = job.find('/');
      const std::string ns = job.substr(0, slash), name = job.substr(slash + 1);
      kube::ObjectPtr cached = jobs_->store().Get(ns, name);
      if (!cached) {  // deleted
        it = patched_.erase(it);
        continue;
      }
      ++it;
      if (!p.pending) continue;
      // After a Conflict, again as soon as the cache holds a newer version than the one refused
      // (the write that won), else at the job's usual pace.
      const std::string version = ResourceVersion(*cached);
      const bool newer = !p.refused_version.empty() && version != p.refused_version;
      if (!newer && now - p.at < kPerJob) continue;
      p.pending = false;
      p.refused_version.clear();
      // Only onto a status that trains, only forward, and only onto the status this cache
      // holds (FiguresPatch): a reconcile may have written the same or newer since.
      std::optional<json> patch = FiguresPatch(*cached, p.figures, Clock::now());
      if (!patch) continue;
      p.at = now;
      auto request =
          kube::MergePatchRequest(kube::Resource::TrainingJobs(), ns, name, *patch, "status");
      if (!request.ok()) {
        LogInfo("could not write the step", {{"job", job}, {"error", request.status().ToString()}});
        continue;
      }
      // Side by side: one at a time, 200 jobs' writes took most of a second.
      writes.push_back(
          {job, ns, name, version, p.figures.step,
           patch_calls_.Submit([this, r = std::move(*request)] { return client_.Call(r); })});
    }
    for (Write& w : writes) {
      StatusOr<json> written = w.done.get();
      if (written.status().code() == StatusCode::kAborted) {
        // The status moved past what the cache held (a reconcile wrote it): tried again onto
        // the newer one once the cache has it.
        if (auto it = patched_.find(w.job); it != patched_.end()) {
          it->second.pending = true;
          it->second.refused_version = w.version;
        }
        continue;
      }
      if (!written.ok()) {
        LogInfo("could not write the step",
                {{"job", w.job}, {"error", written.status().ToString()}});
        continue;
      }
      if (options_.metrics) options_.metrics->SetStep(w.ns, w.name, w.step);
    }
    lock.lock();
  }
}

StatusOr<std::optional<kube::Request>> TrainingJobController::StatusWrite(const json& job,
                                                                          const Plan& plan,
                                                                          bool pushed) {
  const json& md = job["metadata"];
  if (plan.conditions_only) {
    const json current = job.value("status", json());
    const json conditions = ToJson(plan.status.conditions);
    if (current.is_object() && current.value("conditions", json()) == conditions)
      return std::optional<kube::Request>();
    TIDAL_ASSIGN_OR_RETURN(auto request, kube::MergePatchRequest(
                                             kube::Resource::TrainingJobs(),
                                             md.value("namespace", ""), md.value("name", ""),
                                             {{"status", {{"conditions", conditions}}}}, "status"));
    return std::optional<kube::Request>(std::move(request));
  }
  const std::string selector = std::string(kJobLabel) + "=" + JobLabelValue(md.value("name", ""));
  json status = ToJson(plan.status, selector);
  const json current = job.value("status", json());
  if (current == status) return std::optional<kube::Request>();
  // Figures alone, with the workers pushing them onto a status that trains: the patcher writes
  // those (FiguresPatch). (A reconcile that wrote them raced the patcher's writes and lost to a
  // conflict.) Onto any other phase — a job held Paused whose workers have just checkpointed —
  // the patcher writes nothing, so the reconcile does.
  const bool trains = plan.status.phase == planner::Phase::kRunning ||
                      plan.status.phase == planner::Phase::kScaling;
  if (pushed && trains && WithoutFigures(current) == WithoutFigures(status))
    return std::optional<kube::Request>();
  json updated = job;
  updated["status"] = std::move(status);
  TIDAL_ASSIGN_OR_RETURN(
      auto request, kube::ReplaceRequest(kube::Resource::TrainingJobs(), md.value("namespace", ""),
                                         md.value("name", ""), updated, "status"));
  return std::optional<kube::Request>(std::move(request));
}

StatusOr<json> TrainingJobController::WriteStatus(const json& job, const Plan& plan) {
  TIDAL_ASSIGN_OR_RETURN(std::optional<kube::Request> request, StatusWrite(job, plan));
  if (!request) return job;
  auto written = client_.Call(*request);
  if (!written.ok()) return written.status().WithContext("writing status");
  return written;  // its resourceVersion is the one later patches must name
}

void TrainingJobController::Land(const Landing& landing, const json& job) {
  for (const PhaseChange& c : landing.phase_changes) {
    const json fields = {{"job", landing.key},
                         {"generation", landing.figures.generation},
                         {"from", planner::PhaseName(c.from)},
                         {"event", planner::EventName(c.event)},
                         {"to", planner::PhaseName(c.to)},
                         {"reason", c.reason}};
    if (c.refused)
      LogError("phase change refused by the transition table", fields);
    else
      LogInfo("phase", fields);
  }
  if (OperatorMetrics* m = options_.metrics) {
    // Under the lock a deleted job's pass drops its connections under before its series: a
    // write that lands after that pass makes no series for a job that is gone.
    std::lock_guard<std::mutex> lock(connections_mu_);
    if (connections_.count(landing.key)) {
      m->SetJob(landing.namespace_, landing.name, landing.figures);
      if (landing.restarted) m->CountRestart(landing.namespace_, landing.name);
      if (landing.corrupt_resume) m->CountCorruptResume(landing.namespace_, landing.name);
      if (landing.rescale) m->ObserveRescale(landing.rescale->first, landing.rescale->second);
    }
  }
  for (const Event& e : landing.events) recorder_.Record(job, e.type, e.reason, e.message);
}

}  // namespace tidal::controller
