// operator/controller/interval_json.h — a worker's automatic checkpoint interval
// (contract::CheckpointIntervalPlan) as status.checkpointInterval shows it. Shared by the
// reconcile's report of rank 0 and the status feed's figures, so both write the same object.
#pragma once

#include <cmath>

#include <nlohmann/json.hpp>

#include "contract/worker_status.h"

namespace tidal::controller {

// null when the worker reports none (a fixed interval). Times to the microsecond, enough to
// recompute the plan from them (a checkpoint of the tiny preset costs milliseconds).
inline nlohmann::json CheckpointIntervalJson(const contract::WorkerStatus& s) {
  if (!s.checkpoint_interval) return nullptr;
  const contract::CheckpointIntervalPlan& c = *s.checkpoint_interval;
  auto us = [](double seconds) { return std::round(seconds * 1e6) / 1e6; };
  return {{"fullEverySteps", c.full_every_steps},
          {"reason", c.reason},
          {"costSeconds", us(c.cost_seconds)},
          {"stepSeconds", us(c.step_seconds)},
          {"mtbfSeconds", us(c.mtbf_seconds)},
          {"failures", c.failures},
          {"trainedSeconds", us(c.trained_seconds)},
          {"optimumSeconds", us(c.optimum_seconds)},
          {"expectedWastePercent", std::round(c.expected_waste * 1e5) / 1e3}};
}

}  // namespace tidal::controller
