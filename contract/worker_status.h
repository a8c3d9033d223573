// contract/worker_status.h — what a worker reports of itself (worker.proto's WorkerStatus and
// the messages inside it) as plain structs: what the operator reads and the worker fills. The
// protobuf form exists only on the wire (contract/wire.h, used by the gRPC client and the
// worker's service); nothing above this package sees it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/worker_phase.h"

namespace tidal::contract {

struct CheckpointInfo {
  int64_t step = 0;
  std::string kind;  // "full" | "snapshot" | "live" (in the ranks' memory)
  std::string uri;   // the checkpoint directory
  int64_t unix_millis = 0;
  bool operator==(const CheckpointInfo&) const = default;
};

struct StepEvent {
  int64_t generation = 0;
  int64_t step = 0;
  double loss = 0, learning_rate = 0, grad_norm = 0, tokens_per_second = 0;
  double seconds = 0;  // wall time of the step
  int world_size = 0;
  int64_t unix_millis = 0;
  bool skipped = false;  // fp16 overflow: the update was skipped
  std::optional<double> gpu_utilization_percent;
  double data_wait_seconds = 0;  // of `seconds`: waiting for the micro-batches
  bool operator==(const StepEvent&) const = default;
};

// A part of state a worker holds in memory: generation `generation`'s rank `rank` of
// `world_size`, at `step` (its own, its ward's buddy copy, a live checkpoint's part).
struct HeldPart {
  int64_t generation = 0;
  int rank = 0, world_size = 0;
  int64_t step = 0;
  bool operator==(const HeldPart&) const = default;
};

// The newest PrepareEngine's progress.
struct PreparedEngine {
  int64_t generation = 0;  // the generation it was asked for
  int rank = 0, world_size = 0;
  bool ready = false;  // loaded (or read ahead): the Rendezvous only regroups it
  std::string error;   // why it could not be built (the Rendezvous builds anew)
  bool operator==(const PreparedEngine&) const = default;
};

// spec.checkpoint.fullEverySteps auto: the interval a generation checkpoints at now
// (api/checkpoint_interval.h), as rank 0 planned it.
struct CheckpointIntervalPlan {
  int64_t full_every_steps = 0;
  std::string reason;  // Unmeasured | Optimal | AtMinimum | AtMaximum
  double cost_seconds = 0, step_seconds = 0, mtbf_seconds = 0;
  int64_t failures = 0;
  double trained_seconds = 0, optimum_seconds = 0;
  double expected_waste = 0;  // a fraction of training time
  bool operator==(const CheckpointIntervalPlan&) const = default;
};

struct WorkerStatus {
  api::WorkerPhase phase = api::WorkerPhase::kWaiting;
  int64_t generation = 0;  // 0 before the first Rendezvous
  int rank = 0, world_size = 0;
  int64_t step = 0;  // optimizer steps done
  int64_t max_steps = 0;
  // Of the last step (loss: the global mean, every rank sees the same).
  double loss = 0, tokens_per_second = 0, learning_rate = 0, grad_norm = 0;
  // Only when the worker has a GPU and can read its counters; never invented on CPU.
  std::optional<double> gpu_utilization_percent;
  std::optional<int64_t> gpu_memory_used_bytes;
  std::optional<CheckpointInfo> last_checkpoint;  // the newest committed one
  std::string last_error;                         // why the last generation failed, if it did
  // last_error is one a restart cannot fix (a spec field this worker cannot honour).
  bool last_error_permanent = false;
  std::string job;
  int64_t uptime_millis = 0;
  std::vector<StepEvent> recent_steps;  // the newest (at most 64, oldest first, any generation)
  // The live checkpoint it holds its part of, until the generation that reads it has started.
  std::optional<CheckpointInfo> live_checkpoint;
  std::vector<HeldPart> held_parts;
  std::optional<PreparedEngine> prepared_engine;              // none when none was asked
  std::optional<CheckpointIntervalPlan> checkpoint_interval;  // none with a fixed interval
  // The store checkpoint its generation resumed from (none: from the peers' memory, or step 0),
  // and the newer ones that resume skipped as corrupt, each "step-…: why".
  std::optional<CheckpointInfo> resumed_from;
  std::vector<std::string> skipped_checkpoints;
  bool operator==(const WorkerStatus&) const = default;
};

// What of `status` the operator acts on: everything but the step's figures (the step, loss,
// rates, GPU counters, uptime, the recent steps, the newest committed checkpoint, the automatic
// checkpoint interval — recomputed at each full checkpoint — and the step and number of the
// buddy copies held: a rank briefly holds two steps' copies of one part while the newer one
// arrives). Two statuses differ only in figures exactly when their actionable parts are equal.
// The worker pushes a change of it at once and figures at a bounded rate (WatchStatus); the
// operator reconciles a job on the first and only writes the second into status. A barrier's
// checkpoint comes with the change of phase to Paused, which is actionable.
WorkerStatus ActionablePart(const WorkerStatus& status);

}  // namespace tidal::contract
