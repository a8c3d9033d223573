// worker/control/status_change.h — which changes of a WorkerStatus the operator must act on:
// everything but the step's figures (the step, loss, rates, GPU counters, uptime, the recent
// steps, the step and count of the buddy copies held, the newest committed checkpoint and the
// automatic checkpoint interval), which
// it only reports. (A barrier's checkpoint comes with the change of phase to PAUSED, which is
// actionable.) The worker pushes an actionable change at once and step figures at a bounded
// rate (WatchStatus); the operator reconciles a job on the first and only writes the second
// into status.
#pragma once

#include <set>
#include <string>
#include <tuple>

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
  s.clear_last_checkpoint();
  s.clear_checkpoint_interval();  // recomputed at each full checkpoint: reported only
  // Which ranks' parts it holds, not of which step nor how many copies: a rank briefly holds
  // two steps' copies of one part while the newer one arrives.
  std::set<std::tuple<int64_t, int32_t, int32_t>> held;
  for (const auto& part : s.held_parts())
    held.emplace(part.generation(), part.rank(), part.world_size());
  s.clear_held_parts();
  for (const auto& [generation, rank, world_size] : held) {
    auto* part = s.add_held_parts();
    part->set_generation(generation);
    part->set_rank(rank);
    part->set_world_size(world_size);
  }
  std::string out;
  s.SerializeToString(&out);  // no map fields: the bytes are a function of the content
  return out;
}

}  // namespace tidal::worker
