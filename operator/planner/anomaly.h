// operator/planner/anomaly.h — the anomaly rule of spec.anomaly as a pure function: the loss
// rose at each of `consecutiveSteps` consecutive optimizer steps, by more than
// `lossRisePercent` in all from where the rise began, while GPU utilisation stayed under
// `minGPUUtilPercent` at every step of it. A loss that is only noisy (up, down, up) never
// matches, however large its swings. Where the workers report no GPU utilisation (CPU), the
// utilisation clause is skipped — the finding and the rule's description say so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/training_job.h"

namespace tidal::planner {

struct StepSample {
  int64_t step = 0;
  double loss = 0;
  std::optional<double> gpu_utilization_percent;  // none on CPU workers
};

struct LossAnomaly {
  int64_t first_step = 0, last_step = 0;  // the rise runs from first_step's loss to last_step's
  double from_loss = 0, to_loss = 0, rise_percent = 0;
  bool utilization_measured = false;
  double max_utilization_percent = 0;  // over the rise, when measured
  std::string message;
};

// The earliest rise that ends after `after_step` in `steps` (any order; a step seen twice, as
// after a recovery that replays steps, counts with its newest sample: the later entry).
// Windows need `consecutiveSteps` + 1 samples of consecutive step numbers.
std::optional<LossAnomaly> FindLossAnomaly(const std::vector<StepSample>& steps,
                                           const api::AnomalySpec& rule, int64_t after_step);

// What the rule checks, for the job's status: "loss up > 15% over 3 consecutive steps while
// GPU utilisation < 40%", or with "...; GPU utilisation not reported (CPU workers): that
// clause is skipped" when `utilization_reported` is false.
std::string DescribeRule(const api::AnomalySpec& rule, bool utilization_reported);

}  // namespace tidal::planner
