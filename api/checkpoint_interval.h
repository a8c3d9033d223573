// api/checkpoint_interval.h — spec.checkpoint.fullEverySteps: auto. The steps between two full
// checkpoints that minimise the training time a job expects to lose: each checkpoint costs C
// seconds of training, each failure loses on average half an interval of work, so the waste
// per second of training is about C/τ + τ/(2·M) for an interval τ and a mean time between
// failures M, least at Young's τ = √(2·C·M) (J. W. Young, CACM 1974; Daly's higher-order
// correction, FGCS 2006, changes τ by under 10 % while C < M/20, which every real job is).
//
// M is estimated from the job's own failures with expectedMTBF as the prior: a failure rate
// λ with a Gamma(1, expectedMTBF) prior, after n failures over T seconds of training, has the
// posterior mean (1 + n) / (expectedMTBF + T), so M = (expectedMTBF + T) / (1 + n): the prior
// counts as one failure in expectedMTBF of training, and the job's own history outweighs it
// as it grows.
//
// Pure: no clock, no I/O. The worker's rank 0 plans with it (worker/checkpoint), and the
// status shows what it planned.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace tidal::api {

// What spec.checkpoint says about the automatic interval (api/training_job.h).
struct AutoIntervalSpec {
  double expected_mtbf_seconds = 24 * 3600.0;  // spec.checkpoint.expectedMTBF
  int64_t min_steps = 10;                      // spec.checkpoint.minFullEverySteps
  int64_t max_steps = 10000;                   // spec.checkpoint.maxFullEverySteps
};

struct IntervalInputs {
  AutoIntervalSpec spec;
  // C: training time one full checkpoint cost, as measured (0: none measured yet).
  double cost_seconds = 0;
  // Mean wall time of an optimizer step (0: none measured yet).
  double step_seconds = 0;
  int64_t failures = 0;        // the job's restarts so far
  double trained_seconds = 0;  // T: time the job has trained, over all its generations
};

struct IntervalPlan {
  enum class Reason {
    kUnmeasured,  // C or the step time not measured yet: the least interval, whose first
                  // checkpoint measures them
    kOptimal,     // Young's interval, in whole steps
    kAtMinimum,   // Young's interval is shorter than minFullEverySteps
    kAtMaximum,   // ... longer than maxFullEverySteps
  };
  int64_t steps = 0;           // a full checkpoint every this many steps
  double mtbf_seconds = 0;     // M as estimated
  double optimum_seconds = 0;  // √(2·C·M); 0 when unmeasured
  // The share of training time the interval is expected to cost, C/τ + τ/(2·M) with τ the
  // planned interval in seconds (0 when unmeasured).
  double expected_waste = 0;
  Reason reason = Reason::kUnmeasured;
};

// "Optimal", "AtMinimum", "AtMaximum", "Unmeasured": the status's reason.
const char* ReasonName(IntervalPlan::Reason reason);

// Requires 1 <= spec.min_steps <= spec.max_steps and spec.expected_mtbf_seconds > 0 (the spec
// parser's checks); negative or non-finite measurements count as not measured.
IntervalPlan PlanCheckpointInterval(const IntervalInputs& in);

// A duration as Kubernetes writes them (Go's time.ParseDuration, without the sub-second units
// and signs that make no sense for an MTBF): a sequence of decimal numbers, each with a unit
// h, m or s ("24h", "1h30m", "90m", "2.5h", "3600s"). Errors say what was expected.
StatusOr<double> ParseDurationSeconds(const std::string& text);

}  // namespace tidal::api
