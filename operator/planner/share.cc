// operator/planner/share.cc
#include "operator/planner/share.h"

#include <algorithm>
#include <set>

namespace tidal::planner {

bool Yields(int64_t job_priority, int64_t pod_priority, std::optional<int64_t> yield_to_priority) {
  if (yield_to_priority) return pod_priority >= *yield_to_priority && pod_priority >= job_priority;
  return pod_priority > job_priority;
}

namespace {

std::string Gpus(int64_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

// The smallest allowed count above `now` and at most `cap` (none: 0).
int64_t NextStep(const ShareJob& j, int64_t now, int64_t cap) {
  for (int64_t n : j.allowed)
    if (n > now && n <= cap) return n;
  return 0;
}

// Up to three other jobs of at least `j`'s priority that were given GPUs, in the order the
// rules serve them: "ns/a 4 (priority 0, weight 1)", "... minimum 2" for one at its minimum.
std::string Holders(const ShareJob& j, const std::vector<const ShareJob*>& order,
                    std::map<std::string, int64_t>& alloc) {
  std::string out;
  int listed = 0;
  for (const ShareJob* other : order) {
    if (other == &j || other->priority < j.priority || alloc[other->key] == 0 || listed == 3)
      continue;
    out += std::string(listed++ ? ", " : "") + other->key + " " +
           std::to_string(alloc[other->key]) + " (priority " + std::to_string(other->priority) +
           (alloc[other->key] == other->min_gpus ? ", its minimum"
                                                 : ", weight " + std::to_string(other->weight)) +
           ")";
  }
  return out;
}

}  // namespace

std::map<std::string, Share> ShareGpus(const ShareInput& in) {
  std::vector<const ShareJob*> order;
  for (const ShareJob& j : in.jobs) order.push_back(&j);
  std::stable_sort(order.begin(), order.end(), [](const ShareJob* a, const ShareJob* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->created != b->created) return a->created < b->created;
    return a->key < b->key;
  });
  std::map<std::string, Share> out;
  std::map<std::string, int64_t> alloc;
  int64_t free = in.gpus;
  // The GPUs the pods a job of `priority` yields to ask for.
  auto claimed_by_pods = [&](int64_t priority) {
    int64_t n = 0;
    for (const WaitingPod& p : in.waiting)
      if (Yields(priority, p.priority, in.yield_to_priority)) n += std::max<int64_t>(p.gpus, 0);
    return n;
  };
  // 1. A job that runs keeps its minimum.
  for (const ShareJob* j : order)
    if (j->current > 0) {
      alloc[j->key] = j->min_gpus;
      out[j->key].admitted = true;
      free -= j->min_gpus;
    }
  // 2. Jobs that wait, at their minimum, by priority then age.
  for (const ShareJob* j : order) {
    if (j->current > 0) continue;
    Share& s = out[j->key];
    const int64_t claim = claimed_by_pods(j->priority);
    if (free - claim >= j->min_gpus) {
      alloc[j->key] = j->min_gpus;
      s.admitted = true;
      free -= j->min_gpus;
      continue;
    }
    alloc[j->key] = 0;
    s.reason = "waiting: minGPUs " + std::to_string(j->min_gpus) + ", " +
               Gpus(std::max<int64_t>(free - claim, 0)) + " of " + Gpus(in.gpus) +
               " not held by the minimum of a running or older job";
    if (claim > 0) s.reason += " or asked for by pods of a higher priority";
  }
  // 3 and 4. The headroom, by priority level, after the pods each level yields to.
  std::set<std::string> served;  // pods whose GPUs were taken off the headroom
  for (size_t i = 0; i < order.size();) {
    const int64_t level = order[i]->priority;
    size_t end = i;
    while (end < order.size() && order[end]->priority == level) ++end;
    for (const WaitingPod& p : in.waiting)
      if (!served.count(p.key) && Yields(level, p.priority, in.yield_to_priority)) {
        served.insert(p.key);
        free -= std::max<int64_t>(p.gpus, 0);
      }
    for (;;) {
      const ShareJob* best = nullptr;
      int64_t best_next = 0;
      for (size_t k = i; k < end; ++k) {
        const ShareJob* j = order[k];
        if (!out[j->key].admitted) continue;
        const int64_t next = NextStep(*j, alloc[j->key], std::max(j->wanted, j->min_gpus));
        if (next == 0 || next - alloc[j->key] > free) continue;
        // Least headroom per unit of weight first (cross-multiplied: no rounding); `order`
        // puts the older first on a tie.
        const int64_t w = std::max<int64_t>(j->weight, 1);
        if (!best) {
          best = j;
          best_next = next;
          continue;
        }
        const int64_t bw = std::max<int64_t>(best->weight, 1);
        if ((alloc[j->key] - j->min_gpus) * bw < (alloc[best->key] - best->min_gpus) * w) {
          best = j;
          best_next = next;
        }
      }
      if (!best) break;
      free -= best_next - alloc[best->key];
      alloc[best->key] = best_next;
    }
    i = end;
  }
  // Urgency, and the reasons of the admitted.
  std::vector<std::string> waiting_minimum;  // admitted jobs that do not run yet
  for (const ShareJob* j : order)
    if (j->current == 0 && out[j->key].admitted) waiting_minimum.push_back(j->key);
  for (const ShareJob* j : order) {
    Share& s = out[j->key];
    s.gpus = alloc[j->key];
    if (!s.admitted) {
      const std::string holders = Holders(*j, order, alloc);
      if (!holders.empty()) s.reason += " (held by " + holders + ")";
      continue;
    }
    if (s.gpus < j->current) {
      bool stronger = !waiting_minimum.empty() || claimed_by_pods(j->priority) > 0;
      for (const ShareJob* other : order)
        stronger =
            stronger || (other->priority > j->priority && alloc[other->key] > other->current);
      s.urgent = stronger;
    }
    int64_t alone = j->min_gpus;
    for (int64_t n : j->allowed)
      if (n <= std::max(j->wanted, j->min_gpus) && n <= in.gpus - claimed_by_pods(j->priority))
        alone = std::max(alone, n);
    s.shared = s.gpus < alone;
    s.reason = "share " + std::to_string(s.gpus) + " of " + Gpus(in.gpus) + " (priority " +
               std::to_string(j->priority) + ", weight " + std::to_string(j->weight) + ")";
    if (s.gpus >= std::max(j->wanted, j->min_gpus)) continue;
    const std::string others = Holders(*j, order, alloc);
    if (!others.empty()) s.reason += "; shared with " + others;
    if (claimed_by_pods(j->priority) > 0) {
      std::string pods;
      int n = 0;
      for (const WaitingPod& p : in.waiting)
        if (Yields(j->priority, p.priority, in.yield_to_priority) && n++ < 3)
          pods += std::string(n > 1 ? ", " : "") + p.key + " (priority " +
                  std::to_string(p.priority) + ")";
      s.reason += "; yielding to " + pods;
    }
  }
  return out;
}

}  // namespace tidal::planner
