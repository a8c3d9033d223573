// api/training_job.h — the TrainingJob spec (DESIGN.md §2) as the operator reads it:
// typed, defaulted exactly as crds/tidal.dev_trainingjobs.yaml defaults it, and validated
// against everything the CRD's schema and CEL rules say and more (the time zone exists, cron
// expressions parse, URIs and Secret names are well formed). Every violation is reported with
// its field path, so a bad spec gets one InvalidSpec condition that lists them all. No I/O
// besides the time zone database.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/checkpoint_interval.h"
#include "api/cron.h"
#include "api/train_config.h"
#include "common/status.h"

namespace tidal::api {

struct ScheduleWindow {
  std::string name;
  std::string start, end;  // cron expressions in the job's time zone
  CronExpr start_cron, end_cron;
  int64_t gpus = 0;
};

struct ElasticSpec {
  int64_t min_gpus = 1, max_gpus = 1, gpus_per_pod = 1;
  std::string time_zone = "UTC";
  bool require_idle_capacity = true;
  int64_t cooldown_seconds = 300;
  int64_t scale_up_timeout_seconds = 600;
  std::vector<ScheduleWindow> schedule;
  // Sharing the cluster's GPUs with other jobs and workloads (operator/planner/share.h).
  int64_t priority = 0, weight = 1;
  // A PriorityClass instead of `priority`: the job's priority is its value, and the worker pods
  // carry it, so that kube-scheduler's preemption ranks them as the sharing does.
  std::string priority_class_name;
};

struct CheckpointSpec {
  std::string uri;  // "" = a volume of the job's own
  // Checkpoints of another job (or run) to start from: the newest usable one in this store is
  // read when the job's own store holds none, never written. "" = a new job starts fresh.
  std::string resume_from;
  std::string credentials_secret;
  int64_t full_every_steps = 500, snapshot_every_steps = 100, keep = 3;
  // fullEverySteps: auto — the interval planned from the measured checkpoint cost and the
  // job's failure rate (api/checkpoint_interval.h); full_every_steps is then 0.
  bool full_every_auto = false;
  AutoIntervalSpec auto_interval;  // expectedMTBF, min/maxFullEverySteps
  // Steps between buddy copies in the ranks' host memory (DESIGN.md §4 step 5); 0: none.
  int64_t buddy_every_steps = 1;
};

struct AnomalySpec {
  double loss_rise_percent = 15;
  int64_t consecutive_steps = 3;
  double min_gpu_util_percent = 40;
  std::string action = "Alert";  // Pause | Alert
  // The rule ignores rises that end at or before this step. A job that Pause paused resumes
  // once this reaches the step in its LossAnomaly condition (kubectl patch).
  int64_t acknowledged_step = 0;
};

struct RestartPolicy {
  int64_t max_restarts = 10, backoff_seconds = 10;
  // A generation whose workers all answer "training" but whose step has not moved for this
  // long is stalled: its pods are replaced from the newest checkpoint (a restart). 0: never.
  int64_t progress_deadline_seconds = 600;
};

struct WorkerSpec {
  std::string image = "tidal-worker:latest";
  std::string image_pull_policy;
  nlohmann::json resources = nlohmann::json::object();
  nlohmann::json node_selector = nlohmann::json::object();
  nlohmann::json tolerations = nlohmann::json::array();
  nlohmann::json env = nlohmann::json::array();
  std::string tls_secret_name;  // "" → the control API in plaintext
  // The pods' terminationGracePeriodSeconds: how long a worker told to stop (SIGTERM) has to
  // checkpoint and leave before it is killed.
  int64_t termination_grace_period_seconds = 120;
  // "Pack": the pods of a job prefer the nodes that already hold its pods (a preferred pod
  // affinity on the host), so that its ranks' collectives cross as few node boundaries as its
  // GPUs allow; "None": no such hint, the scheduler alone decides.
  std::string placement = "Pack";
};

struct TrainingJobSpec {
  engine::TrainConfig train;  // model, dataset, lora, optimization
  ElasticSpec elastic;
  CheckpointSpec checkpoint;
  std::optional<AnomalySpec> anomaly;  // absent: no anomaly rule
  RestartPolicy restart_policy;
  bool suspend = false;
  WorkerSpec worker;
  std::optional<int64_t> replicas;  // manual GPU count (scale subresource)

  // The GPU counts the job can run at: multiples of gpusPerPod in [minGPUs, maxGPUs] at which
  // the global batch splits into whole micro-batches per rank.
  std::vector<int64_t> AllowedGpuCounts() const;
};

// `spec` is a TrainingJob's .spec. On failure the InvalidArgument lists every violation, one
// per line, "spec.<path>: <what is wrong>".
StatusOr<TrainingJobSpec> ParseTrainingJobSpec(const nlohmann::json& spec);

// The operator's reading of a job it manages: as ParseTrainingJobSpec, except that a spec.replicas
// that is the spec's only fault — `kubectl scale` to a count the job cannot run at, which the
// scale subresource lets through — is left out, with why in `refused_replicas`: the job goes on
// under its schedule and range (and is still recovered and rescaled) instead of stopping as an
// invalid spec for as long as the override stands.
StatusOr<TrainingJobSpec> ParseManagedJobSpec(const nlohmann::json& spec,
                                              std::string* refused_replicas);

}  // namespace tidal::api
