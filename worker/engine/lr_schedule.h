// worker/engine/lr_schedule.h — linear warmup then cosine decay, with adaptive warmup: while
// the gradient norm is erratic (its coefficient of variation over a window exceeds a
// threshold) warmup progress is held, so the LR stays low until training has settled.
// Pure: no LibTorch, no clock; the state is plain numbers (checkpointable).
#pragma once

#include <cstdint>
#include <deque>

#include <nlohmann/json.hpp>

#include "api/train_config.h"
#include "common/status.h"

namespace tidal::engine {

class LrSchedule {
 public:
  explicit LrSchedule(const OptimizationSpec& spec);

  // Called once per optimizer step with that step's gradient norm (before clipping); returns
  // the learning rate to apply to it. Every rank sees the same norms, so every rank agrees.
  double Next(double grad_norm);

  int64_t steps() const { return steps_; }
  int64_t warmup_progress() const { return warmup_progress_; }
  int64_t held_steps() const { return held_steps_; }
  bool in_warmup() const { return warmup_progress_ < warmup_steps_; }
  // Coefficient of variation of the gradient norm over the window (0 until it is full).
  double GradNormVariation() const;

  // Everything that evolves (step counts, adaptive-warmup progress, the norm window), for
  // checkpoints; FromJson refuses a state that does not fit, naming the field.
  nlohmann::json StateJson() const;
  Status RestoreState(const nlohmann::json& state);

 private:
  double peak_, min_lr_;
  int64_t warmup_steps_, max_steps_;
  bool adaptive_;
  int64_t window_;
  double cv_threshold_;
  int64_t max_held_;

  int64_t steps_ = 0;
  int64_t warmup_progress_ = 0;
  int64_t held_steps_ = 0;
  int64_t warmup_end_step_ = -1;  // the step count at which warmup finished
  std::deque<double> norms_;
};

}  // namespace tidal::engine
