// operator/reconciler/data_phase.cc — the data phase (status.data): the prep pod that tokenizes and
// checks the spec before any worker starts, its retries, and the pods of earlier attempts.
#include "common/json_reader.h"
#include "operator/reconciler/decider.h"

namespace tidal::reconciler::internal {

bool Decider::DataReady() {
  const std::string key = DataKey(o_.raw_spec);
  if (!st_.data || st_.data->key != key) {
    const bool said = std::any_of(plan_.events.begin(), plan_.events.end(), [](const Event& e) {
      return e.reason == EventReasonName(EventReason::kSpecChanged);
    });
    if (st_.data && !said)
      Emit(EventReason::kSpecChanged,
           "spec.model, spec.dataset or spec.lora changed: the data phase runs again");
    st_.data = DataStatus{};
    st_.data->key = key;
  }
  DataStatus& d = *st_.data;
  if (d.phase == DataPhase::kReady) return true;
  if (d.phase == DataPhase::kInvalid) {
    plan_.requeue_after = std::chrono::minutes(5);  // a spec edit triggers a reconcile anyway
    return false;
  }
  if (d.phase == DataPhase::kRetrying && d.retry_not_before && o_.now < *d.retry_not_before) {
    plan_.requeue_after =
        std::chrono::duration_cast<std::chrono::milliseconds>(*d.retry_not_before - o_.now);
    return false;
  }
  const std::string name = PrepPodName(o_.name, key, d.failures);
  const PrepPodView* pod = nullptr;
  for (const PrepPodView& p : o_.prep_pods)
    if (p.name == name && !p.deleting) pod = &p;
  plan_.requeue_after = options_.poll;
  if (!pod || pod->phase == PodPhase::kPending || pod->phase == PodPhase::kRunning) {
    if (!pod) {
      // The prep pod reads the spec from the workers' ConfigMap: it gets this spec first (no
      // worker runs now; a new ConfigMap is created with it in this pass).
      const bool updating =
          std::any_of(plan_.actions.begin(), plan_.actions.end(),
                      [](const Action& a) { return As<action::UpdateSpecConfig>(a) != nullptr; });
      if (o_.spec_config_exists && !updating) Do(action::UpdateSpecConfig{});
      Do(action::CreatePrepPod{name});
    }
    if (d.pod != name)
      Emit(EventReason::kPreparingData, "tidal-prep in pod " + name + ": " +
                                            spec_->train.dataset.uri +
                                            " to a token store, checked against the model");
    if (!d.started) d.started = o_.now;
    d.phase = DataPhase::kPreparing;
    d.pod = name;
    d.message = pod && !pod->reason.empty()
                    ? "pod " + name + ": " + pod->reason
                    : "tokenizing in pod " + name + " (kubectl logs " + name + " for progress)";
    return false;
  }
  // tidal-prep's result (`--result`, its termination message), read strictly: a field of the
  // wrong type makes the attempt a failure that says which, never a store taken on trust.
  const json result = json::parse(pod->message, nullptr, /*allow_exceptions=*/false);
  const bool answered = result.is_object();
  JsonReader in;
  const std::string store = in.Get<std::string>(result, "result", "store", "");
  const int64_t samples = in.Get<int64_t>(result, "result", "samples", 0);
  const int64_t tokens = in.Get<int64_t>(result, "result", "tokens", 0);
  const bool reused = in.Get<bool>(result, "result", "reused", false);
  std::string error = in.Get<std::string>(result, "result", "error", "");
  const bool invalid_spec = in.Get<bool>(result, "result", "invalidSpec", false);
  if (pod->phase == PodPhase::kSucceeded && answered && in.ok() && !store.empty()) {
    d.phase = DataPhase::kReady;
    d.store_uri = store;
    d.samples = samples;
    d.tokens = tokens;
    d.reused = reused;
    d.retry_not_before.reset();
    d.message = std::to_string(d.samples) + " samples, " + std::to_string(d.tokens) +
                " tokens in " + d.store_uri + (d.reused ? " (prepared before)" : "");
    Emit(EventReason::kDataReady, d.message);
    Do(action::DeletePods{{name}});
    return true;
  }
  if (!in.ok()) error = "prep pod " + name + ": " + in.status().message();
  if (error.empty())
    error = "prep pod " + name + " " + kube::PodPhaseName(pod->phase) +
            (pod->reason.empty() ? "" : " (" + pod->reason + ")") +
            (pod->message.empty() ? "" : ": " + pod->message);
  if (answered && in.ok() && invalid_spec) {
    d.phase = DataPhase::kInvalid;
    d.message = error;
    Emit(EventReason::kInvalidSpec, error);
    plan_.requeue_after = std::chrono::minutes(5);
    return false;
  }
  ++d.failures;
  d.message = error;
  Do(action::DeletePods{{name}});
  const int64_t max_restarts = spec_->restart_policy.max_restarts;
  if (d.failures > max_restarts) {
    Fail("RestartsExhausted", "the data phase failed " + std::to_string(d.failures) +
                                  " times (maxRestarts " + std::to_string(max_restarts) +
                                  "); last: " + error);
    Emit(EventReason::kRestartsExhausted, st_.failure);
    return false;
  }
  const auto backoff = Backoff(d.failures);
  d.phase = DataPhase::kRetrying;
  d.retry_not_before = o_.now + backoff;
  plan_.requeue_after = backoff;
  Emit(EventReason::kDataPreparationFailed, error + "; retry " + std::to_string(d.failures) +
                                                " of " + std::to_string(max_restarts) + " in " +
                                                std::to_string(backoff.count()) + " s");
  return false;
}

void Decider::CollectPrepPods() {
  std::set<std::string> deleting;
  for (const Action& a : plan_.actions)
    if (auto* d = As<action::DeletePods>(a)) deleting.insert(d->pods.begin(), d->pods.end());
  std::vector<std::string> stale;
  for (const PrepPodView& p : o_.prep_pods) {
    const bool current =
        st_.data && st_.data->phase != DataPhase::kReady && st_.data->pod == p.name;
    if (!current && !p.deleting && !deleting.count(p.name)) stale.push_back(p.name);
  }
  if (!stale.empty()) Do(action::DeletePods{stale});
}

}  // namespace tidal::reconciler::internal
