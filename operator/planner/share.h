// operator/planner/share.h — how the cluster's GPUs are shared among TrainingJobs (issue 50):
// a pure function of every job's claim and the GPUs there are, with no clock and no I/O, so that
// it is tested like Decide (tests/unit/planner/share_test.cc checks every answer against the
// invariants below). The controller keeps its inputs current from its informers
// (operator/controller/share_index.h); each job's reconcile then moves the job toward its share
// with the usual make-before-break rescale.
//
// The rules, in order:
//   1. A job that runs keeps its minGPUs: sharing never takes a job below its minimum (the
//      scheduler's preemption stays the last resort).
//   2. Jobs that wait are admitted at their minGPUs by priority, then age, while the GPUs not yet
//      given out cover it — the headroom of running jobs counts as not given out, so a new job's
//      minimum is met by shrinking others above theirs. A pod of another workload that the job
//      yields to (rule 4) is served first. A job whose minimum does not fit waits with no pod
//      created (nothing bound holds a GPU for it); a smaller job after it may be admitted.
//   3. The headroom left goes to the admitted jobs by priority, highest first; among jobs of
//      one priority by weight: the next GPU step goes to the job with the least headroom per
//      unit of weight (the older on a tie), in the counts its batch allows, up to what it wants
//      now (its schedule, `kubectl scale`, maxGPUs).
//   4. A Pending pod of another workload that asks for GPUs is yielded to by the jobs of a lower
//      priority (or, with a yield threshold, of a priority at most the pod's when the pod's is
//      at least the threshold): its GPUs are taken from their headroom before they share it.
// The answer depends on the jobs' current sizes only through rule 1, so the same cluster always
// gets the same shares: two jobs never trade GPUs back and forth.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tidal::planner {

struct ShareJob {
  std::string key;  // "namespace/name"
  int64_t priority = 0, weight = 1;
  std::chrono::system_clock::time_point created{};  // the older first among equals
  int64_t min_gpus = 1;
  // The counts its batch allows, ascending (each a multiple of gpusPerPod in [min, max]).
  std::vector<int64_t> allowed;
  // The most it wants now: its schedule window, `kubectl scale`, maxGPUs (never below min).
  int64_t wanted = 0;
  int64_t current = 0;  // GPUs its workers hold now; 0: it does not run
};

// A pod of another workload, Pending, that asks for GPUs.
struct WaitingPod {
  std::string key;  // "namespace/name"
  int64_t gpus = 0, priority = 0;
};

struct ShareInput {
  // The GPUs the jobs may share: allocatable on the Ready, schedulable nodes, less what bound
  // pods of other workloads hold there.
  int64_t gpus = 0;
  std::vector<ShareJob> jobs;
  std::vector<WaitingPod> waiting;
  // None: a pod is yielded to by the jobs of a lower priority than its own. A value: also by the
  // jobs of its own priority, and only when its priority is at least the value.
  std::optional<int64_t> yield_to_priority;
};

struct Share {
  int64_t gpus = 0;       // the job's target; 0 when it is not admitted
  bool admitted = false;  // its minimum fits
  // Its share is below what it holds, and someone with a stronger claim waits for the GPUs (a
  // job's minimum, a pod it yields to, a job of a higher priority): the shrink is made at once,
  // without the job's cooldown. A shrink that only evens out jobs of one priority waits it out.
  bool urgent = false;
  // Below what it would get alone with the pods it yields to (the largest count it can run at
  // within what it wants and the GPUs there are): other jobs take part of what it could use.
  // Where not, the share says nothing the capacity gate does not already say.
  bool shared = false;
  std::string reason;  // for status.gpus.reason: "share 2 of 4 GPUs (...)" or "waiting: ..."
};

// Whether a job of `job_priority` yields GPUs to a pod of `pod_priority` (rule 4).
bool Yields(int64_t job_priority, int64_t pod_priority, std::optional<int64_t> yield_to_priority);

std::map<std::string, Share> ShareGpus(const ShareInput& in);

}  // namespace tidal::planner
