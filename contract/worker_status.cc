// contract/worker_status.cc
#include "contract/worker_status.h"

#include <set>
#include <tuple>

namespace tidal::contract {

WorkerStatus ActionablePart(const WorkerStatus& status) {
  WorkerStatus s = status;
  s.step = 0;
  s.loss = s.tokens_per_second = s.learning_rate = s.grad_norm = 0;
  s.gpu_utilization_percent.reset();
  s.gpu_memory_used_bytes.reset();
  s.uptime_millis = 0;
  s.recent_steps.clear();
  s.last_checkpoint.reset();
  s.checkpoint_interval.reset();
  // Which ranks' parts it holds, not of which step nor how many copies.
  std::set<std::tuple<int64_t, int, int>> held;
  for (const HeldPart& part : s.held_parts)
    held.emplace(part.generation, part.rank, part.world_size);
  s.held_parts.clear();
  for (const auto& [generation, rank, world_size] : held)
    s.held_parts.push_back({generation, rank, world_size, 0});
  return s;
}

}  // namespace tidal::contract
