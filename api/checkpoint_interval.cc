#include "api/checkpoint_interval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace tidal::api {

const char* ReasonName(IntervalPlan::Reason reason) {
  switch (reason) {
    case IntervalPlan::Reason::kUnmeasured:
      return "Unmeasured";
    case IntervalPlan::Reason::kOptimal:
      return "Optimal";
    case IntervalPlan::Reason::kAtMinimum:
      return "AtMinimum";
    case IntervalPlan::Reason::kAtMaximum:
      return "AtMaximum";
  }
  return "Unmeasured";
}

namespace {
double Measured(double v) { return std::isfinite(v) && v > 0 ? v : 0; }
// Longer is no prior anyone means (and keeps every product of the planner finite).
constexpr double kMaxDurationSeconds = 100 * 365.25 * 24 * 3600;
}  // namespace

IntervalPlan PlanCheckpointInterval(const IntervalInputs& in) {
  IntervalPlan plan;
  const double trained = Measured(in.trained_seconds);
  const double failures = static_cast<double>(std::max<int64_t>(in.failures, 0));
  plan.mtbf_seconds = (in.spec.expected_mtbf_seconds + trained) / (1.0 + failures);
  const double cost = Measured(in.cost_seconds);
  const double step = Measured(in.step_seconds);
  if (cost == 0 || step == 0) {
    plan.steps = in.spec.min_steps;
    plan.reason = IntervalPlan::Reason::kUnmeasured;
    return plan;
  }
  plan.optimum_seconds = std::sqrt(2.0 * cost * plan.mtbf_seconds);
  // In steps, bounded before the cast: a tiny step time must not overflow int64.
  const double optimum_steps = std::round(plan.optimum_seconds / step);
  if (optimum_steps < static_cast<double>(in.spec.min_steps)) {
    plan.steps = in.spec.min_steps;
    plan.reason = IntervalPlan::Reason::kAtMinimum;
  } else if (optimum_steps > static_cast<double>(in.spec.max_steps)) {
    plan.steps = in.spec.max_steps;
    plan.reason = IntervalPlan::Reason::kAtMaximum;
  } else {
    plan.steps = static_cast<int64_t>(optimum_steps);
    plan.reason = IntervalPlan::Reason::kOptimal;
  }
  const double tau = static_cast<double>(plan.steps) * step;
  plan.expected_waste = cost / tau + tau / (2.0 * plan.mtbf_seconds);
  return plan;
}

StatusOr<double> ParseDurationSeconds(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("\"" + text + "\": " + why +
                           " (expected a duration such as 24h, 1h30m, 90m or 3600s)");
  };
  if (text.empty()) return bad("empty");
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
      ++i;
    if (i == start) return bad("expected a number at \"" + text.substr(start) + "\"");
    const std::string number = text.substr(start, i - start);
    if (std::count(number.begin(), number.end(), '.') > 1 || number == ".")
      return bad("\"" + number + "\" is not a number");
    if (i == text.size()) return bad("\"" + number + "\" has no unit (h, m or s)");
    double unit = 0;
    switch (text[i]) {
      case 'h':
        unit = 3600;
        break;
      case 'm':
        unit = 60;
        break;
      case 's':
        unit = 1;
        break;
      default:
        return bad("unit \"" + std::string(1, text[i]) + "\": expected h, m or s");
    }
    ++i;
    total += std::strtod(number.c_str(), nullptr) * unit;  // digits and one dot: never fails
  }
  if (!std::isfinite(total) || total > kMaxDurationSeconds) return bad("must be at most 100 years");
  if (total <= 0) return bad("must be longer than 0s");
  return total;
}

}  // namespace tidal::api
