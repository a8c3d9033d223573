// operator/reconciler/status_codec.cc — the status subresource to and from JobStatus: read
// strictly (a field of the wrong type is an error naming it), written whole.
#include <cmath>
#include <type_traits>

#include "common/json_reader.h"
#include "operator/reconciler/decider.h"

namespace tidal::reconciler {

using internal::Phase;
using nlohmann::json;
using Stage = RescaleState::Stage;

namespace {

// Reads the status subresource strictly (common/json_reader.h): an absent field takes its
// default (a status written by an older operator), a present one of the wrong type is an error
// naming it. A status the operator cannot read is never replaced by defaults: the controller
// would forget the generation and members of workers that still run.
std::optional<Clock::time_point> Time(JsonReader& in, const json& j, std::string_view path,
                                      const char* key) {
  const json* v = JsonReader::Find(j, key);
  if (!v) return std::nullopt;
  if (v->is_string())
    if (auto t = kube::ParseRfc3339(v->get<std::string>()); t.ok()) return *t;
  in.Fail(json_read::FieldPath(path, key), "an RFC 3339 time", *v);
  return std::nullopt;
}

}  // namespace

StatusOr<JobStatus> JobStatusFromJson(const json& j) {
  JobStatus st;
  if (j.is_null()) return st;
  if (!j.is_object()) return InvalidArgument("status: expected an object, got " + j.dump());
  JsonReader in;
  const std::string at = "status";
  const std::string phase = in.Get<std::string>(j, at, "phase", "Pending");
  if (auto read = planner::PhaseFromName(phase); read.ok())
    st.phase = *read;
  else
    in.Fail(json_read::FieldPath(at, "phase"), "one of " + planner::PhaseNames(), phase);
  st.generation = in.Get<int64_t>(j, at, "generation", 0);
  st.members = in.Strings(j, at, "members");
  st.restarts = in.Get<int64_t>(j, at, "restarts", 0);
  // A status from before the streak was kept: its restarts were all one streak.
  st.restart_streak = in.Get<int64_t>(j, at, "restartStreak", st.restarts);
  st.restart_not_before = Time(in, j, at, "restartNotBefore");
  st.last_membership_change = Time(in, j, at, "lastMembershipChange");
  st.scale_up_not_before = Time(in, j, at, "scaleUpNotBefore");
  st.step = in.Get<int64_t>(j, at, "step", 0);
  st.loss = in.Get<double>(j, at, "loss", 0);
  st.tokens_per_second = in.Get<double>(j, at, "tokensPerSecond", 0);
  if (const json* c = in.Object(j, at, "lastCheckpoint")) st.last_checkpoint = *c;
  if (const json* c = in.Object(j, at, "checkpointInterval")) st.checkpoint_interval = *c;
  if (const json* g = in.Object(j, at, "gpus")) {
    st.desired_gpus = in.Get<int64_t>(*g, "status.gpus", "desired", 0);
    st.current_gpus = in.Get<int64_t>(*g, "status.gpus", "current", 0);
    st.gpus_reason = in.Get<std::string>(*g, "status.gpus", "reason", "");
  }
  st.failure = in.Get<std::string>(j, at, "failure", "");
  st.failure_reason = in.Get<std::string>(j, at, "failureReason", "");
  st.failed_spec_generation = in.Get<int64_t>(j, at, "failedSpecGeneration", 0);
  if (const json* f = in.Object(j, at, "lastFailure")) {
    st.last_failure = in.Get<std::string>(*f, "status.lastFailure", "message", "");
    st.last_failure_time = Time(in, *f, "status.lastFailure", "time");
  }
  if (const json* a = in.Object(j, at, "anomaly")) {
    const std::string in_a = "status.anomaly";
    AnomalyStatus an;
    an.rule = in.Get<std::string>(*a, in_a, "rule", "");
    an.checked_step = in.Get<int64_t>(*a, in_a, "checkedStep", 0);
    if (a->contains("step") && !(*a)["step"].is_null())
      an.step = in.Get<int64_t>(*a, in_a, "step", 0);
    an.message = in.Get<std::string>(*a, in_a, "message", "");
    an.time = Time(in, *a, in_a, "time");
    an.paused = in.Get<bool>(*a, in_a, "paused", false);
    st.anomaly = an;
  }
  if (const json* d = in.Object(j, at, "data")) {
    const std::string in_d = "status.data";
    DataStatus data;
    data.key = in.Get<std::string>(*d, in_d, "key", "");
    const std::string phase = in.Get<std::string>(*d, in_d, "phase", "");
    if (auto read = DataPhaseFromName(phase); read.ok())
      data.phase = *read;
    else
      in.Fail(json_read::FieldPath(in_d, "phase"), read.status().message(),
              d->value("phase", json()));
    data.pod = in.Get<std::string>(*d, in_d, "pod", "");
    data.store_uri = in.Get<std::string>(*d, in_d, "storeUri", "");
    data.samples = in.Get<int64_t>(*d, in_d, "samples", 0);
    data.tokens = in.Get<int64_t>(*d, in_d, "tokens", 0);
    data.reused = in.Get<bool>(*d, in_d, "reused", false);
    data.message = in.Get<std::string>(*d, in_d, "message", "");
    data.failures = in.Get<int64_t>(*d, in_d, "failures", 0);
    data.started = Time(in, *d, in_d, "started");
    data.retry_not_before = Time(in, *d, in_d, "retryNotBefore");
    st.data = data;
  }
  if (auto c = j.find("conditions"); c != j.end() && !c->is_null()) {
    if (auto read = ConditionsFromJson(*c); read.ok())
      st.conditions = std::move(*read);
    else
      in.Absorb(read.status());
  }
  st.observed_generation = in.Get<int64_t>(j, at, "observedGeneration", 0);
  if (const json* r = in.Object(j, at, "rescale")) {
    const std::string in_r = "status.rescale";
    RescaleState rs;
    const std::string stage = in.Get<std::string>(*r, in_r, "stage", "");
    if (stage == "WaitingForPods")
      rs.stage = Stage::kWaitingForPods;
    else if (stage == "Barrier")
      rs.stage = Stage::kBarrier;
    else if (stage == "Rendezvous")
      rs.stage = Stage::kRendezvous;
    else if (in.ok())
      return InvalidArgument("status.rescale.stage: unknown \"" + stage + "\"");
    rs.target_generation = in.Get<int64_t>(*r, in_r, "targetGeneration", 0);
    rs.members = in.Strings(*r, in_r, "members");
    rs.new_pods = in.Strings(*r, in_r, "newPods");
    rs.reason = in.Get<std::string>(*r, in_r, "reason", "");
    rs.recovery = in.Get<bool>(*r, in_r, "recovery", false);
    rs.drain = in.Get<bool>(*r, in_r, "drain", false);
    rs.started = Time(in, *r, in_r, "started").value_or(Clock::time_point{});
    rs.waiting_for = in.Get<std::string>(*r, in_r, "waitingFor", "");
    rs.state_peers = in.Strings(*r, in_r, "statePeers");
    rs.state_step = in.Get<int64_t>(*r, in_r, "stateStep", 0);
    rs.prepare_asked = Time(in, *r, in_r, "prepareAsked");
    rs.barrier_started = Time(in, *r, in_r, "barrierStarted");
    st.rescale = rs;
  }
  if (!in.ok()) return in.status();
  return st;
}

void ObserveStatus(const json& raw, Observed& o) {
  auto status = JobStatusFromJson(raw);
  if (status.ok()) {
    o.status = *status;
    o.status_error.clear();
    return;
  }
  o.status = JobStatus{};
  o.status_error = status.status().message();
  if (auto c = raw.find("conditions"); raw.is_object() && c != raw.end())
    if (auto read = ConditionsFromJson(*c); read.ok()) o.status.conditions = std::move(*read);
}

json ToJson(const std::vector<Condition>& conditions) {
  json out = json::array();
  for (const Condition& c : conditions)
    out.push_back({{"type", c.type},
                   {"status", ConditionStatusName(c.status)},
                   {"reason", c.reason},
                   {"message", c.message},
                   {"lastTransitionTime", kube::FormatTime(c.last_transition_time)},
                   {"observedGeneration", c.observed_generation}});
  return out;
}

StatusOr<std::vector<Condition>> ConditionsFromJson(const json& j) {
  std::vector<Condition> out;
  if (j.is_null()) return out;
  JsonReader in;
  if (!j.is_array()) {
    in.Fail("status.conditions", "a list", j);
    return in.status();
  }
  for (size_t i = 0; i < j.size() && in.ok(); ++i) {
    const std::string at = "status.conditions[" + std::to_string(i) + "]";
    const json& c = j[i];
    if (!c.is_object()) {
      in.Fail(at, "an object", c);
      break;
    }
    Condition read;
    read.type = in.Get<std::string>(c, at, "type", "");
    if (read.type.empty() && in.ok())
      in.Fail(json_read::FieldPath(at, "type"), "a condition type", c);
    const std::string status = in.Get<std::string>(c, at, "status", "");
    bool known = false;
    for (ConditionStatus s :
         {ConditionStatus::kTrue, ConditionStatus::kFalse, ConditionStatus::kUnknown})
      if (status == ConditionStatusName(s)) {
        read.status = s;
        known = true;
      }
    if (!known && in.ok())
      in.Fail(json_read::FieldPath(at, "status"), "True, False or Unknown",
              c.value("status", json()));
    read.reason = in.Get<std::string>(c, at, "reason", "");
    read.message = in.Get<std::string>(c, at, "message", "");
    read.last_transition_time = Time(in, c, at, "lastTransitionTime").value_or(Clock::time_point{});
    read.observed_generation = in.Get<int64_t>(c, at, "observedGeneration", 0);
    out.push_back(std::move(read));
  }
  if (!in.ok()) return in.status();
  return out;
}

json ToJson(const JobStatus& st, const std::string& label_selector) {
  json j = {{"phase", planner::PhaseName(st.phase)},
            {"generation", st.generation},
            {"members", st.members},
            {"restarts", st.restarts},
            {"restartStreak", st.restart_streak},
            {"step", st.step},
            {"loss", st.loss},
            {"tokensPerSecond", st.tokens_per_second},
            {"gpus",
             {{"desired", st.desired_gpus},
              {"current", st.current_gpus},
              {"summary", std::to_string(st.current_gpus) + "/" + std::to_string(st.desired_gpus)},
              {"reason", st.gpus_reason}}},
            {"selector", label_selector},
            {"conditions", ToJson(st.conditions)},
            {"observedGeneration", st.observed_generation}};
  if (!st.last_checkpoint.is_null()) j["lastCheckpoint"] = st.last_checkpoint;
  if (!st.checkpoint_interval.is_null()) j["checkpointInterval"] = st.checkpoint_interval;
  if (!st.failure.empty()) j["failure"] = st.failure;
  if (!st.failure_reason.empty()) j["failureReason"] = st.failure_reason;
  if (st.failed_spec_generation > 0) j["failedSpecGeneration"] = st.failed_spec_generation;
  if (!st.last_failure.empty()) {
    j["lastFailure"] = {{"message", st.last_failure}};
    if (st.last_failure_time) j["lastFailure"]["time"] = kube::FormatTime(*st.last_failure_time);
  }
  if (st.anomaly) {
    const AnomalyStatus& a = *st.anomaly;
    json& out = j["anomaly"] = {{"rule", a.rule}, {"checkedStep", a.checked_step}};
    if (a.step) {
      out["step"] = *a.step;
      out["message"] = a.message;
      out["paused"] = a.paused;
    }
    if (a.time) out["time"] = kube::FormatTime(*a.time);
  }
  if (st.data) {
    const DataStatus& d = *st.data;
    json& out = j["data"] = {{"key", d.key},          {"phase", DataPhaseName(d.phase)},
                             {"pod", d.pod},          {"storeUri", d.store_uri},
                             {"samples", d.samples},  {"tokens", d.tokens},
                             {"reused", d.reused},    {"message", d.message},
                             {"failures", d.failures}};
    if (d.started) out["started"] = kube::FormatTime(*d.started);
    if (d.retry_not_before) out["retryNotBefore"] = kube::FormatTime(*d.retry_not_before);
  }
  if (st.restart_not_before) j["restartNotBefore"] = kube::FormatTime(*st.restart_not_before);
  if (st.last_membership_change)
    j["lastMembershipChange"] = kube::FormatTime(*st.last_membership_change);
  if (st.scale_up_not_before) j["scaleUpNotBefore"] = kube::FormatTime(*st.scale_up_not_before);
  if (st.rescale) {
    const RescaleState& r = *st.rescale;
    j["rescale"] = {{"stage", StageName(r.stage)},
                    {"targetGeneration", r.target_generation},
                    {"members", r.members},
                    {"newPods", r.new_pods},
                    {"reason", r.reason},
                    {"recovery", r.recovery},
                    {"started", kube::FormatTime(r.started)}};
    if (r.drain) j["rescale"]["drain"] = true;
    if (!r.waiting_for.empty()) j["rescale"]["waitingFor"] = r.waiting_for;
    if (r.prepare_asked) j["rescale"]["prepareAsked"] = kube::FormatTime(*r.prepare_asked);
    if (r.barrier_started) j["rescale"]["barrierStarted"] = kube::FormatTime(*r.barrier_started);
    if (!r.state_peers.empty()) {
      j["rescale"]["statePeers"] = r.state_peers;
      j["rescale"]["stateStep"] = r.state_step;
    }
  }
  return j;
}

namespace {
constexpr const char* kFigures[] = {"step", "loss", "tokensPerSecond", "lastCheckpoint",
                                    "checkpointInterval"};

std::optional<int64_t> IntegerField(const json& object, const char* field) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(field);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
// lastCheckpoint.step of a status (-1: none or unreadable).
int64_t CheckpointStep(const json& status) {
  if (!status.is_object()) return -1;
  return IntegerField(status.value("lastCheckpoint", json()), "step").value_or(-1);
}
}  // namespace

json WithoutFigures(json status) {
  if (status.is_object())
    for (const char* figure : kFigures) status.erase(figure);
  return status;
}

bool OnlyFiguresChanged(const json& before, const json& after) {
  auto strip = [](json j) {
    if (auto md = j.find("metadata"); md != j.end() && md->is_object()) {
      md->erase("resourceVersion");
      md->erase("managedFields");
    }
    if (auto st = j.find("status"); st != j.end()) *st = WithoutFigures(std::move(*st));
    return j;
  };
  return strip(before) == strip(after);
}

std::optional<json> FiguresPatch(const json& cached_job, const StepFigures& f,
                                 Clock::time_point now) {
  if (!cached_job.is_object()) return std::nullopt;
  const auto status = cached_job.find("status");
  if (status == cached_job.end() || !status->is_object()) return std::nullopt;
  const json phase = status->value("phase", json());
  if (phase != "Running" && phase != "Scaling") return std::nullopt;
  const std::optional<int64_t> step = IntegerField(*status, "step");
  if (!step) return std::nullopt;
  // Figures of a generation the status has moved past (its rank 0 trains on until the new one
  // starts) are not the job's any more.
  if (f.generation < IntegerField(*status, "generation").value_or(0)) return std::nullopt;
  json figures = json::object();
  if (f.step > *step) {
    figures["step"] = f.step;
    figures["loss"] = std::round(f.loss * 1e4) / 1e4;  // as Decide rounds it
    figures["tokensPerSecond"] = f.tokens_per_second;
  }
  // A checkpoint past the known one; or another one while rank 0 trains past status.step — its
  // figures are current then, not the ones it paused with: after a resume that fell back from
  // an unreadable newest checkpoint, the new ones are behind the status's and still the job's.
  const json known = status->value("lastCheckpoint", json());
  const bool other = !known.is_object() || known.value("uri", json()) != f.checkpoint_uri;
  if (f.checkpoint_step >= 0 &&
      (f.checkpoint_step > CheckpointStep(*status) || (other && f.step > *step)))
    figures["lastCheckpoint"] = {{"step", f.checkpoint_step},
                                 {"kind", f.checkpoint_kind},
                                 {"uri", f.checkpoint_uri},
                                 {"time", kube::FormatTime(now)}};
  if (!f.checkpoint_interval.is_null() &&
      status->value("checkpointInterval", json()) != f.checkpoint_interval)
    figures["checkpointInterval"] = f.checkpoint_interval;
  if (figures.empty()) return std::nullopt;
  json patch = {{"status", std::move(figures)}};
  const json& md = cached_job.value("metadata", json());
  if (md.is_object() && md.value("resourceVersion", json()).is_string())
    patch["metadata"] = {{"resourceVersion", md["resourceVersion"]}};
  return patch;
}

}  // namespace tidal::reconciler
