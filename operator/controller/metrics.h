// operator/controller/metrics.h — every metric the operator exports (DESIGN.md §7), defined
// here and nowhere else. Names follow Prometheus conventions: the tidal_ prefix, base units,
// _seconds, _total. Per-job series carry the labels namespace and trainingjob ("job" is
// Prometheus' own target label) and are removed when the job goes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tidal::controller {

class OperatorMetrics {
 public:
  OperatorMetrics();
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // How a reconcile pass ended: it decided (ok), returned an error (and was requeued), or
  // started the status asks a decision needs and decided nothing (their answers wake the job).
  enum class PassResult { kOk, kError, kAwaiting };
  void ObserveReconcile(double seconds, PassResult result);
  void SetQueueDepth(size_t depth);
  // A job as of its latest reconcile (its status); Forget drops its series.
  struct JobFigures {
    std::string phase;
    int64_t desired_gpus = 0, current_gpus = 0;
    int64_t step = 0, generation = 0;
    bool loss_anomaly = false;  // the LossAnomaly condition is True
    int64_t share_gpus = -1;    // its share of the cluster's GPUs (-1: not shared)
  };
  void SetJob(const std::string& ns, const std::string& name, const JobFigures& job);
  void ForgetJob(const std::string& ns, const std::string& name);
  // The step alone, as the workers push it between reconciles (a job not seen yet: nothing).
  void SetStep(const std::string& ns, const std::string& name, int64_t step);
  // Every job's series: this replica stopped leading (another one reports them now).
  void ForgetAllJobs();
  // A rescale (make-before-break or recovery) finished, from decision to the new generation.
  void ObserveRescale(const std::string& kind, double seconds);
  void CountRestart(const std::string& ns, const std::string& name);
  // A generation resumed from an older checkpoint because newer ones were corrupt.
  void CountCorruptResume(const std::string& ns, const std::string& name);
  // A Kubernetes API request that failed: its HTTP status, or 0 when none came back.
  void CountApiError(const std::string& verb, int code);
  // A Kubernetes API request's time from sending it to its answer, by verb (get, post, ...).
  void ObserveApiRequest(const std::string& verb, double seconds);
  // A plan's writes (its status first, then its API writes), from the end of the pass that
  // made them to the end of the last, queueing included; `ok`: they all landed.
  void ObservePlanWrites(double seconds, bool ok);
  void SetLeader(bool leading);
  // The cluster's GPUs as the sharing sees them: the GPUs jobs share, those given to jobs as
  // their shares, and those Pending pods of other workloads ask for.
  void SetClusterGpus(int64_t shared, int64_t given, int64_t asked_by_others);
  // A Pending GPU pod some job yields to was bound to a node this long after it was first seen.
  void ObserveGiveBack(double seconds);

 private:
  struct JobSeries {
    std::string phase;
    bool loss_anomaly = false;
    prometheus::Gauge* desired = nullptr;
    prometheus::Gauge* current = nullptr;
    prometheus::Gauge* step = nullptr;
    prometheus::Gauge* generation = nullptr;
    prometheus::Gauge* anomaly = nullptr;
    prometheus::Gauge* share = nullptr;
    std::map<std::string, prometheus::Gauge*> phase_series;  // every phase: 1 for the current
  };
  void RecountPhases();  // under mu_

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& reconcile_duration_;
  prometheus::Histogram* reconcile_ok_ = nullptr;
  prometheus::Histogram* reconcile_error_ = nullptr;
  prometheus::Histogram* reconcile_awaiting_ = nullptr;
  prometheus::Gauge& queue_depth_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& gpus_desired_;
  prometheus::Family<prometheus::Gauge>& gpus_current_;
  prometheus::Family<prometheus::Gauge>& job_phase_;
  prometheus::Family<prometheus::Gauge>& job_step_;
  prometheus::Family<prometheus::Gauge>& job_generation_;
  prometheus::Family<prometheus::Gauge>& loss_anomaly_;
  prometheus::Family<prometheus::Counter>& loss_anomalies_;
  prometheus::Family<prometheus::Counter>& corrupt_resumes_;
  prometheus::Family<prometheus::Histogram>& rescale_duration_;
  std::map<std::string, prometheus::Histogram*> rescale_by_kind_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& api_errors_;
  prometheus::Family<prometheus::Histogram>& api_duration_;
  prometheus::Family<prometheus::Histogram>& plan_writes_duration_;
  prometheus::Histogram* plan_writes_ok_ = nullptr;
  prometheus::Histogram* plan_writes_failed_ = nullptr;
  std::mutex api_mu_;
  std::map<std::string, prometheus::Histogram*> api_by_verb_;  // guarded by api_mu_
  prometheus::Gauge& leader_;
  prometheus::Family<prometheus::Gauge>& gpus_share_;
  prometheus::Family<prometheus::Gauge>& cluster_gpus_;
  prometheus::Histogram& give_back_;

  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, JobSeries> jobs_by_key_;
};

}  // namespace tidal::controller
