// worker/control/status_change.h — which changes of a WorkerStatus the operator must act on:
// everything but the step's figures (the step, loss, rates, GPU counters, uptime, the recent
// steps, and the step of each held buddy copy), which it only reports. The worker pushes an
// actionable change at once and step figures at a bounded rate (WatchStatus); the operator
// reconciles a job on the first and only writes the second into status.
#pragma once

#include <string>

#include "tidal/worker/v1/worker.pb.h"

namespace tidal::worker {

// Equal for two statuses exactly when they differ in step figures only.
inline std::string ActionableDigest(const ::tidal::worker::v1::WorkerStatus& status) {
  ::tidal::worker::v1::WorkerStatus s = status;
  s.clear_step();
  s.clear_loss();
  s.clear_tokens_per_second();
  s.clear_learning_rate();
  s.clear_grad_norm();
  s.clear_gpu_utilization_percent();
  s.clear_gpu_memory_used_bytes();
  s.clear_uptime_millis();
  s.clear_recent_steps();
  for (auto& part : *s.mutable_held_parts()) part.clear_step();
  std::string out;
  s.SerializeToString(&out);  // no map fields: the bytes are a function of the content
  return out;
}

}  // namespace tidal::worker
