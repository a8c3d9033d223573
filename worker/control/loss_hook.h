// worker/control/loss_hook.h — a test hook that changes the loss a worker *reports* (logs,
// GetStatus, step events, /metrics), never the loss it trains on, so the operator's anomaly
// rule (spec.anomaly) can be exercised end to end on a real job. Set through the worker's
// environment, TIDAL_TEST_LOSS_HOOK (spec.worker.env in a TrainingJob):
//   rise:STEP:FACTOR   from STEP on, the loss is multiplied by FACTOR^(step - STEP + 1)
//   noise:AMPLITUDE    the running mean of the loss (0.9 old + 0.1 new) times (1 + AMPLITUDE) on
//                      odd steps and (1 - AMPLITUDE) on even ones: it swings every step and
//                      never trends. Around the mean, not the step's own loss, so that the real
//                      loss's batch-to-batch spread (which can exceed the swing) never lines up
//                      three rising steps (an e2e test relies on it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace tidal::worker {

struct LossHook {
  enum class Kind { kNone, kRise, kNoise };
  Kind kind = Kind::kNone;
  int64_t from_step = 0;
  double factor = 1;  // kRise: per step; kNoise: the amplitude

  // Called once per step, in step order (kNoise keeps the running mean).
  double Apply(int64_t step, double loss);

 private:
  std::optional<double> mean_;
};

// "" → no hook. InvalidArgument naming TIDAL_TEST_LOSS_HOOK and the expected forms otherwise.
StatusOr<LossHook> ParseLossHook(const std::string& text);

}  // namespace tidal::worker
