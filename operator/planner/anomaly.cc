#include "operator/planner/anomaly.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace tidal::planner {
namespace {

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::optional<LossAnomaly> FindLossAnomaly(const std::vector<StepSample>& steps,
                                           const api::AnomalySpec& rule, int64_t after_step) {
  std::map<int64_t, StepSample> by_step;
  for (const StepSample& s : steps) by_step[s.step] = s;  // the later sample of a step wins
  const int64_t k = rule.consecutive_steps;
  for (auto end = by_step.begin(); end != by_step.end(); ++end) {
    if (end->first <= after_step) continue;
    // end and the k samples before it, each one step apart, each loss above the one before.
    std::vector<const StepSample*> window{&end->second};
    auto it = end;
    bool rising = true;
    for (int64_t i = 0; i < k && rising; ++i) {
      if (it == by_step.begin()) {
        rising = false;
        break;
      }
      auto prev = std::prev(it);
      rising = prev->first == it->first - 1 && it->second.loss > prev->second.loss;
      window.push_back(&prev->second);
      it = prev;
    }
    if (!rising) continue;
    const StepSample& first = *window.back();
    const StepSample& last = *window.front();
    if (!(first.loss > 0)) continue;
    const double rise = (last.loss - first.loss) / first.loss * 100;
    if (!(rise > rule.loss_rise_percent)) continue;
    // The utilisation clause: every step of the rise under the floor. Steps that report no
    // utilisation (CPU) skip it; a mix counts only the steps that report one.
    bool measured = false, busy = false;
    double max_util = 0;
    for (const StepSample* s : window) {
      if (!s->gpu_utilization_percent) continue;
      measured = true;
      max_util = std::max(max_util, *s->gpu_utilization_percent);
      if (*s->gpu_utilization_percent >= rule.min_gpu_util_percent) busy = true;
    }
    if (busy) continue;
    LossAnomaly a;
    a.first_step = first.step;
    a.last_step = last.step;
    a.from_loss = first.loss;
    a.to_loss = last.loss;
    a.rise_percent = rise;
    a.utilization_measured = measured;
    a.max_utilization_percent = max_util;
    a.message = "loss rose " + Number(first.loss) + " -> " + Number(last.loss) + " (+" +
                Number(rise) + "%) over steps " + std::to_string(first.step) + "-" +
                std::to_string(last.step) +
                (measured ? " with GPU utilisation at most " + Number(max_util) + "% (< " +
                                Number(rule.min_gpu_util_percent) + "%)"
                          : "; GPU utilisation not reported (CPU workers): that clause was "
                            "skipped");
    return a;
  }
  return std::nullopt;
}

std::string DescribeRule(const api::AnomalySpec& rule, bool utilization_reported) {
  std::string text = "loss up > " + Number(rule.loss_rise_percent) + "% over " +
                     std::to_string(rule.consecutive_steps) + " consecutive rising steps";
  if (utilization_reported)
    return text + " while GPU utilisation < " + Number(rule.min_gpu_util_percent) + "%";
  return text + "; GPU utilisation not reported (CPU workers): that clause is skipped";
}

}  // namespace tidal::planner
