// worker/engine/lr_schedule.cc
#include "worker/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tidal::engine {

LrSchedule::LrSchedule(const OptimizationSpec& spec)
    : peak_(spec.learning_rate),
      min_lr_(spec.learning_rate * spec.min_lr_ratio),
      warmup_steps_(spec.warmup.steps),
      max_steps_(spec.max_steps),
      adaptive_(spec.warmup.adaptive),
      window_(spec.warmup.window),
      cv_threshold_(spec.warmup.cv_threshold),
      max_held_(spec.warmup.max_extra_steps.value_or(spec.warmup.steps)) {}

double LrSchedule::GradNormVariation() const {
  if (static_cast<int64_t>(norms_.size()) < window_) return 0;
  double mean = 0;
  for (double n : norms_) mean += n;
  mean /= norms_.size();
  double var = 0;
  for (double n : norms_) var += (n - mean) * (n - mean);
  var /= norms_.size() - 1;
  return mean > 0 ? std::sqrt(var) / mean : 0;
}

double LrSchedule::Next(double grad_norm) {
  ++steps_;
  if (std::isfinite(grad_norm)) {
    norms_.push_back(grad_norm);
    if (static_cast<int64_t>(norms_.size()) > window_) norms_.pop_front();
  }
  if (in_warmup()) {
    const bool hold = adaptive_ && held_steps_ < max_held_ && GradNormVariation() > cv_threshold_;
    if (hold) {
      ++held_steps_;
    } else {
      ++warmup_progress_;
    }
    const double lr = peak_ * static_cast<double>(std::max<int64_t>(warmup_progress_, 1)) /
                      static_cast<double>(warmup_steps_);
    if (!in_warmup()) warmup_end_step_ = steps_;
    return lr;
  }
  if (warmup_end_step_ < 0) warmup_end_step_ = steps_ - 1;  // no warmup at all
  const int64_t decay_steps = std::max<int64_t>(max_steps_ - warmup_end_step_, 1);
  const double t = std::min(1.0, static_cast<double>(steps_ - warmup_end_step_) / decay_steps);
  return min_lr_ + (peak_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

nlohmann::json LrSchedule::StateJson() const {
  return {{"steps", steps_},
          {"warmupProgress", warmup_progress_},
          {"heldSteps", held_steps_},
          {"warmupEndStep", warmup_end_step_},
          {"gradNorms", std::vector<double>(norms_.begin(), norms_.end())}};
}

Status LrSchedule::RestoreState(const nlohmann::json& state) {
  auto integer = [&](const char* key, int64_t& out) -> Status {
    if (!state.is_object() || !state.contains(key) || !state[key].is_number_integer())
      return InvalidArgument(std::string("lrSchedule.") + key + ": expected an integer");
    out = state[key].get<int64_t>();
    return OkStatus();
  };
  int64_t steps = 0, progress = 0, held = 0, end = 0;
  TIDAL_RETURN_IF_ERROR(integer("steps", steps));
  TIDAL_RETURN_IF_ERROR(integer("warmupProgress", progress));
  TIDAL_RETURN_IF_ERROR(integer("heldSteps", held));
  TIDAL_RETURN_IF_ERROR(integer("warmupEndStep", end));
  if (!state.contains("gradNorms") || !state["gradNorms"].is_array())
    return InvalidArgument("lrSchedule.gradNorms: expected a list of numbers");
  std::deque<double> norms;
  for (const auto& n : state["gradNorms"]) {
    if (!n.is_number()) return InvalidArgument("lrSchedule.gradNorms: expected a list of numbers");
    norms.push_back(n.get<double>());
  }
  steps_ = steps;
  warmup_progress_ = progress;
  held_steps_ = held;
  warmup_end_step_ = end;
  norms_ = std::move(norms);
  return OkStatus();
}

}  // namespace tidal::engine
