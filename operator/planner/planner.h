// operator/planner/planner.h — how many GPUs a TrainingJob should run on (DESIGN.md §3), as
// pure functions of the spec, the cluster's free capacity and an injected clock:
//
//   target  = spec.replicas (manual override) ?: the largest gpus of the schedule windows open
//             now in the job's time zone ?: elastic.minGPUs
//   gated   = with requireIdleCapacity, no more than the GPUs the job holds plus the idle
//             allocatable GPUs of the nodes it may use (never below what it holds)
//   desired = the largest allowed count (a multiple of gpusPerPod that splits the global batch)
//             at or below gated, clamped to [minGPUs, maxGPUs]
//   hold    = inside elastic.cooldownSeconds of the last membership change, keep the current
//             count (failures excepted: recovery does not wait for the cooldown)
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "api/training_job.h"
#include "operator/planner/share.h"

namespace tidal::planner {

using Clock = std::chrono::system_clock;

// Whether `window` is open at `now` in time zone `tz`: its last start at or before `now` is
// later than its last end. A start or end that falls in a daylight-saving gap happens when the
// gap ends; one in a repeated hour, at its first occurrence. Windows with no start in the
// past 400 days are closed.
bool WindowOpen(const api::ScheduleWindow& window, const std::string& tz, Clock::time_point now);

// The last instant at or before `now` whose local wall-clock minute in `tz` matches `cron`.
std::optional<Clock::time_point> LastOccurrence(const api::CronExpr& cron, const std::string& tz,
                                                Clock::time_point now);
// The first instant after `now` whose local wall-clock minute in `tz` matches `cron` (the same
// daylight-saving rules as LastOccurrence), within 400 days; none beyond.
std::optional<Clock::time_point> NextOccurrence(const api::CronExpr& cron, const std::string& tz,
                                                Clock::time_point now);

struct Capacity {
  int64_t idle_gpus = 0;  // allocatable nvidia.com/gpu on eligible nodes minus other pods' requests
  // The job's share of the cluster (ShareGpus; none: not shared, as in tests of one job). It
  // bounds the target; not admitted, the job waits with no pod; a shrink below what it holds
  // is made at once when `urgent`, else after the cooldown. With requireIdleCapacity false it
  // bounds only shrinks: the job asks the scheduler for the rest.
  std::optional<Share> share;
};

struct Decision {
  int64_t desired = 0;  // the count to run at now
  // What the job wants — its schedule, override or range, at a count its batch allows — before
  // the capacity gate and the cooldown: status.gpus.desired, so that a job held below it shows
  // the gap (TidalTrainingJobBelowDesiredGpus), with `reason` saying why.
  int64_t wanted = 0;
  std::string reason;  // for status.gpus.reason: which rule set the count
  // The next instant at which the clock alone may change the answer — a schedule window's
  // start or end, the cooldown's end — so that the controller sets a timer instead of polling.
  // None when only the spec, the capacity or the job's size can.
  std::optional<Clock::time_point> revisit;
  // The capacity gate held the count below what the schedule wants: GPUs freed elsewhere
  // change the answer, and nothing announces them to this job.
  bool capacity_limited = false;
  // Its share does not admit it (its minimum does not fit): desired is 0, no pod is made.
  bool waiting = false;
};

struct JobState {
  int64_t current_gpus = 0;                      // what the job holds now
  std::optional<Clock::time_point> last_change;  // of the membership
};

Decision DesiredGpus(const api::TrainingJobSpec& spec, const JobState& state,
                     const Capacity& capacity, Clock::time_point now);
// What the job wants at `now` before capacity, share and cooldown (Decision::wanted): its
// override or open window, in its range, at a count its batch allows. Unlike DesiredGpus it looks
// for no next window change: cheap enough to ask of every job whenever shares are computed.
int64_t WantedGpus(const api::TrainingJobSpec& spec, Clock::time_point now);

}  // namespace tidal::planner
