#include "operator/controller/metrics.h"

#include "common/metrics/endpoint.h"
#include "operator/planner/lifecycle.h"

namespace tidal::controller {

OperatorMetrics::OperatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      reconcile_duration_(
          prometheus::BuildHistogram()
              .Name("tidal_operator_reconcile_duration_seconds")
              .Help("Time of one reconcile pass of one TrainingJob, in seconds, by result "
                    "(ok, error, awaiting: asked the workers, decided nothing yet).")
              .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("tidal_operator_workqueue_depth")
                       .Help("TrainingJob keys waiting in the work queue to be reconciled.")
                       .Register(*registry_)
                       .Add({})),
      jobs_(prometheus::BuildGauge()
                .Name("tidal_trainingjobs")
                .Help("TrainingJobs this operator reconciles, by phase.")
                .Register(*registry_)),
      gpus_desired_(prometheus::BuildGauge()
                        .Name("tidal_trainingjob_gpus_desired")
                        .Help("GPUs the operator wants a TrainingJob to have (schedule, "
                              "override and capacity gate applied).")
                        .Register(*registry_)),
      gpus_current_(prometheus::BuildGauge()
                        .Name("tidal_trainingjob_gpus_current")
                        .Help("GPUs a TrainingJob's current generation trains on.")
                        .Register(*registry_)),
      job_phase_(prometheus::BuildGauge()
                     .Name("tidal_trainingjob_phase")
                     .Help("1 for a TrainingJob's current phase, 0 for the others (one series "
                           "per phase).")
                     .Register(*registry_)),
      job_step_(prometheus::BuildGauge()
                    .Name("tidal_trainingjob_step")
                    .Help("A TrainingJob's optimizer step, as its status reports it.")
                    .Register(*registry_)),
      job_generation_(prometheus::BuildGauge()
                          .Name("tidal_trainingjob_generation")
                          .Help("A TrainingJob's membership generation: +1 on every rescale "
                                "or recovery (DESIGN.md §4).")
                          .Register(*registry_)),
      loss_anomaly_(prometheus::BuildGauge()
                        .Name("tidal_trainingjob_loss_anomaly")
                        .Help("1 while a TrainingJob's LossAnomaly condition is True (its "
                              "spec.anomaly rule found a sustained loss rise), else 0.")
                        .Register(*registry_)),
      loss_anomalies_(prometheus::BuildCounter()
                          .Name("tidal_trainingjob_loss_anomalies_total")
                          .Help("Loss rises the spec.anomaly rule found in a TrainingJob.")
                          .Register(*registry_)),
      corrupt_resumes_(prometheus::BuildCounter()
                           .Name("tidal_trainingjob_corrupt_checkpoint_resumes_total")
                           .Help("Generations of a TrainingJob that found its newest "
                                 "checkpoint(s) corrupt and resumed from an older one.")
                           .Register(*registry_)),
      rescale_duration_(  // "rescale" in the wide sense: any change of generation
          prometheus::BuildHistogram()
              .Name("tidal_trainingjob_rescale_duration_seconds")
              .Help("Time from a rescale decision to every member running the new "
                    "generation, in seconds, by kind (start, resume, scale_up, scale_down, drain, "
                    "recovery).")
              .Register(*registry_)),
      restarts_(prometheus::BuildCounter()
                    .Name("tidal_trainingjob_restarts_total")
                    .Help("Failures of a TrainingJob's generation that the operator "
                          "recovered from (or gave up on, past maxRestarts).")
                    .Register(*registry_)),
      api_errors_(prometheus::BuildCounter()
                      .Name("tidal_operator_api_errors_total")
                      .Help("Kubernetes API requests of the operator that failed, by verb "
                            "and HTTP status code (0: no answer).")
                      .Register(*registry_)),
      api_duration_(prometheus::BuildHistogram()
                        .Name("tidal_operator_api_request_duration_seconds")
                        .Help("Time of the operator's Kubernetes API requests, from sending one "
                              "to its answer, in seconds, by verb (watches not counted).")
                        .Register(*registry_)),
      plan_writes_duration_(
          prometheus::BuildHistogram()
              .Name("tidal_operator_plan_writes_duration_seconds")
              .Help("Time of a reconcile plan's writes (its status, then the children and pods "
                    "it creates or deletes), run after the pass: from the pass's end to the "
                    "last write's answer, queueing included, in seconds, by result (ok, error).")
              .Register(*registry_)),
      leader_(prometheus::BuildGauge()
                  .Name("tidal_operator_leader")
                  .Help("1 while this operator process holds the leader lease and "
                        "reconciles, else 0.")
                  .Register(*registry_)
                  .Add({})),
      gpus_share_(prometheus::BuildGauge()
                      .Name("tidal_trainingjob_gpus_share")
                      .Help("A TrainingJob's share of the cluster's GPUs among every job and the "
                            "Pending pods it yields to (0: its minimum does not fit, it waits).")
                      .Register(*registry_)),
      cluster_gpus_(prometheus::BuildGauge()
                        .Name("tidal_cluster_gpus")
                        .Help("The cluster's GPUs as the sharing sees them, by state: shared "
                              "(what TrainingJobs share: Ready, schedulable nodes less what "
                              "other workloads' bound pods hold), given (the jobs' shares), "
                              "asked_by_others (what Pending pods of other workloads ask for).")
                        .Register(*registry_)),
      give_back_(prometheus::BuildHistogram()
                     .Name("tidal_cluster_give_back_seconds")
                     .Help("Time from a Pending GPU pod that TrainingJobs yield to being seen to "
                           "it being bound to a node, in seconds.")
                     .Register(*registry_)
                     .Add({}, metrics::ExponentialBuckets(0.1, 1.5, 20))) {
  // Buckets from 1 ms to ~25 s by factors of 1.5 for a pass (it calls every worker; fine enough
  // for p50/p99 estimates), 0.5 s to ~68 min for a
  // rescale (pods starting, a checkpoint barrier, resharded resume).
  const auto pass = metrics::ExponentialBuckets(0.001, 1.5, 26);
  reconcile_ok_ = &reconcile_duration_.Add({{"result", "ok"}}, pass);
  reconcile_error_ = &reconcile_duration_.Add({{"result", "error"}}, pass);
  reconcile_awaiting_ = &reconcile_duration_.Add({{"result", "awaiting"}}, pass);
  plan_writes_ok_ = &plan_writes_duration_.Add({{"result", "ok"}}, pass);
  plan_writes_failed_ = &plan_writes_duration_.Add({{"result", "error"}}, pass);
  const auto rescale = metrics::ExponentialBuckets(0.5, 2, 14);
  for (const char* kind : {"start", "resume", "scale_up", "scale_down", "drain", "recovery"})
    rescale_by_kind_[kind] = &rescale_duration_.Add({{"kind", kind}}, rescale);
  std::lock_guard<std::mutex> lock(mu_);
  RecountPhases();
}

void OperatorMetrics::ObserveReconcile(double seconds, PassResult result) {
  switch (result) {
    case PassResult::kOk:
      reconcile_ok_->Observe(seconds);
      break;
    case PassResult::kError:
      reconcile_error_->Observe(seconds);
      break;
    case PassResult::kAwaiting:
      reconcile_awaiting_->Observe(seconds);
      break;
  }
}

void OperatorMetrics::SetQueueDepth(size_t depth) { queue_depth_.Set(static_cast<double>(depth)); }

void OperatorMetrics::SetJob(const std::string& ns, const std::string& name,
                             const JobFigures& job) {
  std::lock_guard<std::mutex> lock(mu_);
  JobSeries& series = jobs_by_key_[{ns, name}];
  const prometheus::Labels labels{{"namespace", ns}, {"trainingjob", name}};
  if (!series.desired) {
    series.desired = &gpus_desired_.Add(labels);
    series.current = &gpus_current_.Add(labels);
    series.step = &job_step_.Add(labels);
    series.generation = &job_generation_.Add(labels);
    series.anomaly = &loss_anomaly_.Add(labels);
    series.share = &gpus_share_.Add(labels);
    // Every phase a job can be in has a series (0 when not), so a query never sees one vanish.
    for (planner::Phase p : planner::AllPhases()) {
      const char* phase = planner::PhaseName(p);
      prometheus::Labels with_phase = labels;
      with_phase["phase"] = phase;
      series.phase_series[phase] = &job_phase_.Add(with_phase);
    }
    // Counters at 0 from the start, so that increase() sees the first one.
    loss_anomalies_.Add(labels);
    corrupt_resumes_.Add(labels);
    restarts_.Add(labels);
  }
  series.desired->Set(static_cast<double>(job.desired_gpus));
  series.current->Set(static_cast<double>(job.current_gpus));
  series.step->Set(static_cast<double>(job.step));
  series.generation->Set(static_cast<double>(job.generation));
  series.anomaly->Set(job.loss_anomaly ? 1 : 0);
  series.share->Set(static_cast<double>(std::max<int64_t>(job.share_gpus, 0)));
  if (job.loss_anomaly && !series.loss_anomaly) loss_anomalies_.Add(labels).Increment();
  series.loss_anomaly = job.loss_anomaly;
  for (const auto& [phase, gauge] : series.phase_series) gauge->Set(phase == job.phase ? 1 : 0);
  if (series.phase != job.phase) {
    series.phase = job.phase;
    RecountPhases();
  }
}

void OperatorMetrics::SetStep(const std::string& ns, const std::string& name, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_by_key_.find({ns, name});
  if (it != jobs_by_key_.end() && it->second.step) it->second.step->Set(static_cast<double>(step));
}

void OperatorMetrics::ForgetJob(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_by_key_.find({ns, name});
  if (it == jobs_by_key_.end()) return;
  JobSeries& series = it->second;
  gpus_desired_.Remove(series.desired);
  gpus_current_.Remove(series.current);
  job_step_.Remove(series.step);
  job_generation_.Remove(series.generation);
  loss_anomaly_.Remove(series.anomaly);
  gpus_share_.Remove(series.share);
  for (const auto& [phase, gauge] : series.phase_series) job_phase_.Remove(gauge);
  jobs_by_key_.erase(it);
  const prometheus::Labels labels{{"namespace", ns}, {"trainingjob", name}};
  if (restarts_.Has(labels)) restarts_.Remove(&restarts_.Add(labels));
  if (loss_anomalies_.Has(labels)) loss_anomalies_.Remove(&loss_anomalies_.Add(labels));
  if (corrupt_resumes_.Has(labels)) corrupt_resumes_.Remove(&corrupt_resumes_.Add(labels));
  RecountPhases();
}

void OperatorMetrics::ForgetAllJobs() {
  std::vector<std::pair<std::string, std::string>> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, series] : jobs_by_key_) keys.push_back(key);
  }
  for (const auto& [ns, name] : keys) ForgetJob(ns, name);
}

void OperatorMetrics::RecountPhases() {
  std::map<std::string, int> counts;
  for (planner::Phase p : planner::AllPhases()) counts[planner::PhaseName(p)] = 0;
  for (const auto& [key, series] : jobs_by_key_) ++counts[series.phase];
  for (const auto& [phase, count] : counts) jobs_.Add({{"phase", phase}}).Set(count);
}

void OperatorMetrics::ObserveRescale(const std::string& kind, double seconds) {
  auto it = rescale_by_kind_.find(kind);
  if (it != rescale_by_kind_.end()) it->second->Observe(seconds);
}

void OperatorMetrics::CountRestart(const std::string& ns, const std::string& name) {
  restarts_.Add({{"namespace", ns}, {"trainingjob", name}}).Increment();
}

void OperatorMetrics::CountCorruptResume(const std::string& ns, const std::string& name) {
  corrupt_resumes_.Add({{"namespace", ns}, {"trainingjob", name}}).Increment();
}

void OperatorMetrics::ObserveApiRequest(const std::string& verb, double seconds) {
  prometheus::Histogram* h;
  {
    std::lock_guard<std::mutex> lock(api_mu_);
    prometheus::Histogram*& known = api_by_verb_[verb];
    if (!known)
      known = &api_duration_.Add({{"verb", verb}}, metrics::ExponentialBuckets(0.001, 1.5, 26));
    h = known;
  }
  h->Observe(seconds);
}

void OperatorMetrics::ObservePlanWrites(double seconds, bool ok) {
  (ok ? plan_writes_ok_ : plan_writes_failed_)->Observe(seconds);
}

void OperatorMetrics::CountApiError(const std::string& verb, int code) {
  api_errors_.Add({{"verb", verb}, {"code", std::to_string(code)}}).Increment();
}

void OperatorMetrics::SetLeader(bool leading) { leader_.Set(leading ? 1 : 0); }

void OperatorMetrics::SetClusterGpus(int64_t shared, int64_t given, int64_t asked_by_others) {
  cluster_gpus_.Add({{"state", "shared"}}).Set(static_cast<double>(shared));
  cluster_gpus_.Add({{"state", "given"}}).Set(static_cast<double>(given));
  cluster_gpus_.Add({{"state", "asked_by_others"}}).Set(static_cast<double>(asked_by_others));
}

void OperatorMetrics::ObserveGiveBack(double seconds) { give_back_.Observe(seconds); }

}  // namespace tidal::controller
