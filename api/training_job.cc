// api/training_job.cc
#include "api/training_job.h"

#include <date/tz.h>

#include <algorithm>
#include <regex>
#include <set>

#include "api/spec_limits.h"
#include "api/spec_section.h"

namespace tidal::api {
namespace {

using nlohmann::json;
using spec::Section;

// RFC 1123 subdomain, as Kubernetes names Secrets.
bool ValidSecretName(const std::string& name) {
  static const std::regex kName(
      "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
  return name.size() <= 253 && std::regex_match(name, kName);
}

// RFC 1123 label, as the CRD requires of window names.
bool ValidLabel(const std::string& name) {
  static const std::regex kLabel("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  return name.size() <= 63 && std::regex_match(name, kLabel);
}

// A checkpoint store URI: file:///abs, or s3://bucket[/prefix] with a valid bucket name.
std::string CheckStoreUri(const std::string& uri) {
  if (uri.rfind("file:///", 0) == 0) return "";
  if (uri.rfind("s3://", 0) == 0) {
    const std::string rest = uri.substr(5);
    const std::string bucket = rest.substr(0, rest.find('/'));
    static const std::regex kBucket("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$");
    if (!std::regex_match(bucket, kBucket))
      return "bucket \"" + bucket + "\" is not a valid S3 bucket name (3-63 of a-z 0-9 . -)";
    return "";
  }
  return "expected file:///absolute/dir or s3://bucket/prefix, got \"" + uri + "\"";
}

void ReadElastic(const json& spec, ElasticSpec& e, std::vector<std::string>& errors) {
  Section s(spec, "elastic", "spec", errors);
  s.Int("minGPUs", e.min_gpus);
  s.Int("maxGPUs", e.max_gpus);
  s.Int("gpusPerPod", e.gpus_per_pod);
  s.String("timeZone", e.time_zone);
  s.Bool("requireIdleCapacity", e.require_idle_capacity);
  s.Int("cooldownSeconds", e.cooldown_seconds);
  s.Int("scaleUpTimeoutSeconds", e.scale_up_timeout_seconds);
  s.Int("priority", e.priority);
  s.Int("weight", e.weight);
  s.String("priorityClassName", e.priority_class_name);
  s.InRange("minGPUs", e.min_gpus, 1, spec::kMaxGpus);
  s.InRange("maxGPUs", e.max_gpus, 1, spec::kMaxGpus);
  s.InRange("gpusPerPod", e.gpus_per_pod, 1, spec::kMaxGpusPerPod);
  s.InRange("cooldownSeconds", e.cooldown_seconds, 0, spec::kMaxSeconds);
  s.InRange("scaleUpTimeoutSeconds", e.scale_up_timeout_seconds, 1, spec::kMaxSeconds);
  s.InRange("priority", e.priority, -spec::kMaxPriority, spec::kMaxPriority);
  s.InRange("weight", e.weight, 1, spec::kMaxWeight);
  if (!e.priority_class_name.empty()) {
    static const std::regex kSubdomain(
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
    if (e.priority_class_name.size() > 253 || !std::regex_match(e.priority_class_name, kSubdomain))
      s.Error("priorityClassName",
              "expected a PriorityClass name (a lowercase DNS subdomain), got \"" +
                  e.priority_class_name + "\"");
    else if (e.priority != 0)
      s.Error("priorityClassName", "set priority or priorityClassName, not both (priority " +
                                       std::to_string(e.priority) + ")");
  }
  try {
    (void)date::locate_zone(e.time_zone);
  } catch (const std::exception&) {
    s.Error("timeZone", "unknown IANA time zone \"" + e.time_zone + "\" (e.g. Asia/Shanghai, UTC)");
  }
  if (const json* windows = s.Field("schedule")) {
    if (!windows->is_array()) {
      s.Error("schedule", "expected a list of windows");
      return;
    }
    std::set<std::string> names;
    for (size_t i = 0; i < windows->size(); ++i) {
      const std::string path = s.path() + ".schedule[" + std::to_string(i) + "]";
      Section w((*windows)[i], path, errors);
      if (!(*windows)[i].is_object()) {
        errors.push_back(path + ": expected an object with name, start, end and gpus");
        continue;
      }
      ScheduleWindow window;
      w.String("name", window.name);
      w.String("start", window.start);
      w.String("end", window.end);
      w.Int("gpus", window.gpus);
      if (!ValidLabel(window.name))
        w.Error("name", "expected a lowercase RFC 1123 label, got \"" + window.name + "\"");
      else if (!names.insert(window.name).second)
        w.Error("name", "duplicate window \"" + window.name + "\"");
      for (auto [key, text, cron] : {std::tuple{"start", &window.start, &window.start_cron},
                                     std::tuple{"end", &window.end, &window.end_cron}}) {
        auto parsed = ParseCron(*text);
        if (!parsed.ok())
          w.Error(key, "cron \"" + *text + "\": " + parsed.status().message());
        else
          *cron = *parsed;
      }
      w.InRange("gpus", window.gpus, 1, spec::kMaxGpus);
      e.schedule.push_back(std::move(window));
    }
  }
}

void ReadCheckpoint(const json& spec, CheckpointSpec& c, std::vector<std::string>& errors) {
  Section s(spec, "checkpoint", "spec", errors);
  s.String("uri", c.uri);
  s.String("resumeFrom", c.resume_from);
  s.String("credentialsSecret", c.credentials_secret);
  s.IntOrAuto("fullEverySteps", c.full_every_steps, c.full_every_auto);
  if (c.full_every_auto) c.full_every_steps = 0;
  std::string mtbf = "24h";
  s.String("expectedMTBF", mtbf);
  if (auto seconds = ParseDurationSeconds(mtbf); !seconds.ok())
    s.Error("expectedMTBF", seconds.status().message());
  else
    c.auto_interval.expected_mtbf_seconds = *seconds;
  s.Int("minFullEverySteps", c.auto_interval.min_steps);
  s.Int("maxFullEverySteps", c.auto_interval.max_steps);
  s.Int("snapshotEverySteps", c.snapshot_every_steps);
  s.Int("keep", c.keep);
  s.Int("buddyEverySteps", c.buddy_every_steps);
  if (!c.uri.empty())
    if (std::string why = CheckStoreUri(c.uri); !why.empty()) s.Error("uri", why);
  if (!c.resume_from.empty())
    if (std::string why = CheckStoreUri(c.resume_from); !why.empty()) s.Error("resumeFrom", why);
  if (!c.resume_from.empty() && c.resume_from == c.uri)
    s.Error("resumeFrom",
            "is spec.checkpoint.uri itself: the job resumes its own checkpoints "
            "anyway; name another job's store");
  if (!c.credentials_secret.empty() && !ValidSecretName(c.credentials_secret))
    s.Error("credentialsSecret",
            "\"" + c.credentials_secret + "\" is not a valid Secret name (RFC 1123 subdomain)");
  s.InRange("fullEverySteps", c.full_every_steps, 0, spec::kMaxSteps);
  s.InRange("minFullEverySteps", c.auto_interval.min_steps, 1, spec::kMaxSteps);
  s.InRange("maxFullEverySteps", c.auto_interval.max_steps, 1, spec::kMaxSteps);
  if (c.auto_interval.min_steps > c.auto_interval.max_steps)
    s.Error("minFullEverySteps", "must not exceed maxFullEverySteps (" +
                                     std::to_string(c.auto_interval.max_steps) + "), got " +
                                     std::to_string(c.auto_interval.min_steps));
  s.InRange("snapshotEverySteps", c.snapshot_every_steps, 0, spec::kMaxSteps);
  s.InRange("keep", c.keep, 1, spec::kMaxKeep);
  s.InRange("buddyEverySteps", c.buddy_every_steps, 0, spec::kMaxSteps);
}

void ReadAnomaly(const json& spec, std::optional<AnomalySpec>& out,
                 std::vector<std::string>& errors) {
  Section s(spec, "anomaly", "spec", errors);
  if (!s.present()) return;
  AnomalySpec a;
  s.Number("lossRisePercent", a.loss_rise_percent);
  s.Int("consecutiveSteps", a.consecutive_steps);
  s.Number("minGPUUtilPercent", a.min_gpu_util_percent);
  s.String("action", a.action);
  s.Int("acknowledgedStep", a.acknowledged_step);
  s.InRange("acknowledgedStep", a.acknowledged_step, 0, spec::kMaxSteps);
  if (!(a.loss_rise_percent > 0)) s.Error("lossRisePercent", "must be > 0");
  s.InRange("consecutiveSteps", a.consecutive_steps, 1, spec::kMaxAnomalySteps);
  if (!(a.min_gpu_util_percent >= 0 && a.min_gpu_util_percent <= 100))
    s.Error("minGPUUtilPercent", "must be in [0, 100]");
  s.OneOf("action", a.action, {"Pause", "Alert"});
  out = a;
}

void ReadWorker(const json& spec, WorkerSpec& w, std::vector<std::string>& errors) {
  Section s(spec, "worker", "spec", errors);
  s.String("image", w.image);
  s.String("imagePullPolicy", w.image_pull_policy);
  if (!w.image_pull_policy.empty())
    s.OneOf("imagePullPolicy", w.image_pull_policy, {"Always", "IfNotPresent", "Never"});
  if (w.image.empty()) s.Error("image", "must not be empty");
  s.String("tlsSecretName", w.tls_secret_name);
  if (!w.tls_secret_name.empty() && !ValidSecretName(w.tls_secret_name))
    s.Error("tlsSecretName",
            "\"" + w.tls_secret_name + "\" is not a valid Secret name (RFC 1123 subdomain)");
  auto take = [&](const char* key, json& out, bool object) {
    if (const json* v = s.Field(key)) {
      if (object ? v->is_object() : v->is_array())
        out = *v;
      else
        s.Error(key, object ? "expected an object" : "expected a list");
    }
  };
  take("resources", w.resources, true);
  take("nodeSelector", w.node_selector, true);
  take("tolerations", w.tolerations, false);
  take("env", w.env, false);
  s.Int("terminationGracePeriodSeconds", w.termination_grace_period_seconds);
  s.InRange("terminationGracePeriodSeconds", w.termination_grace_period_seconds, 0, 3600);
  s.String("placement", w.placement);
  s.OneOf("placement", w.placement, {"Pack", "None"});
}

// Whether `gpus` ranks split the global batch into whole micro-batches (gradient
// accumulation a whole number). Overflow-free: microBatchSize × gpus is never formed.
bool SplitsBatch(const engine::OptimizationSpec& o, int64_t gpus) {
  return gpus >= 1 && o.micro_batch_size >= 1 && o.global_batch_size % o.micro_batch_size == 0 &&
         (o.global_batch_size / o.micro_batch_size) % gpus == 0;
}

// Under gradient compression with groups set, a GPU count must divide them: each rank compresses
// whole groups.
bool SplitsGroups(const engine::OptimizationSpec& o, int64_t gpus) {
  const auto& gc = o.gradient_compression;
  return !gc.enabled() || gc.groups == 0 || (gpus >= 1 && gc.groups % gpus == 0);
}

// The CRD's CEL rules, and the same for the manual count. Runs only on values inside their
// bounds (api/spec_limits.h), so the products in the messages fit in int64.
void CheckSizes(const TrainingJobSpec& j, std::vector<std::string>& errors) {
  const ElasticSpec& e = j.elastic;
  const auto& o = j.train.optimization;
  auto within = [](int64_t v, int64_t max) { return v >= 1 && v <= max; };
  if (!within(e.min_gpus, spec::kMaxGpus) || !within(e.max_gpus, spec::kMaxGpus) ||
      !within(e.gpus_per_pod, spec::kMaxGpusPerPod) ||
      !within(o.micro_batch_size, spec::kMaxMicroBatchSize) ||
      !within(o.global_batch_size, spec::kMaxGlobalBatchSize))
    return;
  if (e.min_gpus > e.max_gpus)
    errors.push_back("spec.elastic: minGPUs (" + std::to_string(e.min_gpus) +
                     ") must not exceed maxGPUs (" + std::to_string(e.max_gpus) + ")");
  for (auto [key, n] : {std::pair{"minGPUs", e.min_gpus}, std::pair{"maxGPUs", e.max_gpus}}) {
    if (n % e.gpus_per_pod != 0)
      errors.push_back("spec.elastic." + std::string(key) + ": " + std::to_string(n) +
                       " is not a multiple of gpusPerPod (" + std::to_string(e.gpus_per_pod) + ")");
    if (!SplitsBatch(o, n))
      errors.push_back("spec.optimization.globalBatchSize: " + std::to_string(o.global_batch_size) +
                       " is not divisible by microBatchSize × " + key + " = " +
                       std::to_string(o.micro_batch_size * n));
    if (!SplitsGroups(o, n))
      errors.push_back("spec.elastic." + std::string(key) + ": " + std::to_string(n) +
                       " does not divide spec.optimization.gradientCompression.groups (" +
                       std::to_string(o.gradient_compression.groups) + ")");
  }
  // microBatchSize auto starts at 1 and grows to what fits: its steps may be this long only
  // where memory is short, which the measurement reports; a fixed size is checked here.
  if (!o.micro_batch_auto && SplitsBatch(o, e.min_gpus) &&
      o.global_batch_size / (o.micro_batch_size * e.min_gpus) > spec::kMaxMicroBatchesPerStep)
    errors.push_back(
        "spec.optimization.globalBatchSize: " + std::to_string(o.global_batch_size) +
        " sequences per step are " +
        std::to_string(o.global_batch_size / (o.micro_batch_size * e.min_gpus)) +
        " micro-batches of " + std::to_string(o.micro_batch_size) + " per rank at minGPUs " +
        std::to_string(e.min_gpus) + ", more than " +
        std::to_string(spec::kMaxMicroBatchesPerStep) +
        ": one step would hold every rescale, checkpoint and deletion for its whole length "
        "(raise microBatchSize or minGPUs, or lower globalBatchSize)");
  const auto& gc = o.gradient_compression;
  if (gc.enabled() && gc.groups > 0 && o.global_batch_size % o.micro_batch_size == 0 &&
      (o.global_batch_size / o.micro_batch_size) % gc.groups != 0)
    errors.push_back("spec.optimization.gradientCompression.groups: " + std::to_string(gc.groups) +
                     " does not divide globalBatchSize / microBatchSize = " +
                     std::to_string(o.global_batch_size / o.micro_batch_size) +
                     " (a group is a whole number of micro-batches)");
  auto check_count = [&](const std::string& field, int64_t n) {
    if (n < e.min_gpus || n > e.max_gpus)
      errors.push_back(field + ": " + std::to_string(n) +
                       " GPUs is outside [minGPUs, maxGPUs] = [" + std::to_string(e.min_gpus) +
                       ", " + std::to_string(e.max_gpus) + "]");
    else if (n % e.gpus_per_pod != 0)
      errors.push_back(field + ": " + std::to_string(n) + " is not a multiple of gpusPerPod (" +
                       std::to_string(e.gpus_per_pod) + ")");
    else if (!SplitsBatch(o, n))
      errors.push_back(field + ": at " + std::to_string(n) + " GPUs globalBatchSize " +
                       std::to_string(o.global_batch_size) +
                       " does not split into whole micro-batches of " +
                       std::to_string(o.micro_batch_size) + " per rank");
    else if (!SplitsGroups(o, n))
      errors.push_back(field + ": " + std::to_string(n) +
                       " does not divide spec.optimization.gradientCompression.groups (" +
                       std::to_string(o.gradient_compression.groups) + ")");
  };
  for (size_t i = 0; i < e.schedule.size(); ++i)
    if (e.schedule[i].gpus >= 1)
      check_count("spec.elastic.schedule[" + std::to_string(i) + "].gpus", e.schedule[i].gpus);
  if (j.replicas) check_count("spec.replicas", *j.replicas);
}

}  // namespace

std::vector<int64_t> TrainingJobSpec::AllowedGpuCounts() const {
  // A count n is allowed when gpusPerPod divides it and n divides globalBatchSize /
  // microBatchSize (and gradientCompression.groups, when set): the divisors of that quotient,
  // found by trial division up to its square root — never a walk over [minGPUs, maxGPUs],
  // which the user sets.
  const auto& o = train.optimization;
  std::vector<int64_t> out;
  if (o.micro_batch_size < 1 || o.global_batch_size < 1 ||
      o.global_batch_size % o.micro_batch_size != 0 || elastic.gpus_per_pod < 1)
    return out;
  const int64_t q = o.global_batch_size / o.micro_batch_size;
  auto consider = [&](int64_t n) {
    if (n >= elastic.min_gpus && n <= elastic.max_gpus && n % elastic.gpus_per_pod == 0 &&
        SplitsGroups(o, n))
      out.push_back(n);
  };
  for (int64_t d = 1; d <= q / d; ++d) {
    if (q % d != 0) continue;
    consider(d);
    if (d != q / d) consider(q / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<TrainingJobSpec> ParseTrainingJobSpec(const json& spec) {
  if (!spec.is_object()) return InvalidArgument("spec: expected an object");
  std::vector<std::string> errors;
  TrainingJobSpec j;
  {
    Section root(spec, "spec", errors);
    for (const char* key : {"model", "dataset", "lora", "optimization", "elastic", "checkpoint",
                            "anomaly", "restartPolicy", "worker"})
      root.Known(key);
    engine::ReadEngineSections(spec, "", j.train, errors);
    ReadElastic(spec, j.elastic, errors);
    ReadCheckpoint(spec, j.checkpoint, errors);
    ReadAnomaly(spec, j.anomaly, errors);
    {
      Section r(spec, "restartPolicy", "spec", errors);
      r.Int("maxRestarts", j.restart_policy.max_restarts);
      r.Int("backoffSeconds", j.restart_policy.backoff_seconds);
      r.InRange("maxRestarts", j.restart_policy.max_restarts, 0, spec::kMaxRestarts);
      r.InRange("backoffSeconds", j.restart_policy.backoff_seconds, 0, spec::kMaxSeconds);
      r.Int("progressDeadlineSeconds", j.restart_policy.progress_deadline_seconds);
      r.InRange("progressDeadlineSeconds", j.restart_policy.progress_deadline_seconds, 0,
                spec::kMaxSeconds);
    }
    ReadWorker(spec, j.worker, errors);
    root.Bool("suspend", j.suspend);
    if (const json* replicas = root.Field("replicas")) {
      if (replicas->is_number_integer() && replicas->get<int64_t>() >= 1 &&
          replicas->get<int64_t>() <= spec::kMaxGpus)
        j.replicas = replicas->get<int64_t>();
      else
        root.Error("replicas", "expected an integer in [1, " + std::to_string(spec::kMaxGpus) +
                                   "], got " + replicas->dump());
    }
  }
  CheckSizes(j, errors);
  if (!errors.empty()) {
    std::string message;
    for (const std::string& e : errors) {
      if (!message.empty()) message += '\n';
      message += spec::OneLine(e);
    }
    return InvalidArgument(message);
  }
  return j;
}

StatusOr<TrainingJobSpec> ParseManagedJobSpec(const json& spec, std::string* refused_replicas) {
  refused_replicas->clear();
  StatusOr<TrainingJobSpec> parsed = ParseTrainingJobSpec(spec);
  if (parsed.ok() || !spec.is_object() || !spec.contains("replicas")) return parsed;
  json without = spec;
  without.erase("replicas");
  StatusOr<TrainingJobSpec> rest = ParseTrainingJobSpec(without);
  if (!rest.ok()) return parsed;  // other faults: the whole message, replicas' included
  *refused_replicas = parsed.status().message();
  return rest;
}

}  // namespace tidal::api
