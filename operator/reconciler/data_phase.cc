// operator/reconciler/data_phase.cc — the data phase (status.data): the prep pod that tokenizes and
// checks the spec before any worker starts, its retries, and the pods of earlier attempts.
#include "operator/reconciler/decider.h"

namespace tidal::controller::internal {

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
  const json result = json::parse(pod->message, nullptr, /*allow_exceptions=*/false);
  const bool answered = result.is_object();
  if (pod->phase == PodPhase::kSucceeded && answered && result.contains("store") &&
      result["store"].is_string()) {
    d.phase = DataPhase::kReady;
    d.store_uri = result["store"];
    d.samples = Value<int64_t>(result, "samples", 0);
    d.tokens = Value<int64_t>(result, "tokens", 0);
    d.reused = Value<bool>(result, "reused", false);
    d.retry_not_before.reset();
    d.message = std::to_string(d.samples) + " samples, " + std::to_string(d.tokens) +
                " tokens in " + d.store_uri + (d.reused ? " (prepared before)" : "");
    Emit(EventReason::kDataReady, d.message);
    Do(action::DeletePods{{name}});
    return true;
  }
  std::string error = answered ? Value<std::string>(result, "error", "") : "";
  if (error.empty())
    error = "prep pod " + name + " " + kube::PodPhaseName(pod->phase) +
            (pod->reason.empty() ? "" : " (" + pod->reason + ")") +
            (pod->message.empty() ? "" : ": " + pod->message);
  if (answered && Value<bool>(result, "invalidSpec", false)) {
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

}  // namespace tidal::controller::internal
