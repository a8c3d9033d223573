// worker/engine/optimizer.h — AdamW over the trainable slices this rank owns (ZeRO: the
// optimizer state covers only the local slice). The parameters are fp32 and are the master
// weights; m and v are fp32. With offload, m and v live in host memory and the update runs
// there (DeepSpeed's offload_optimizer: cpu).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "worker/engine/zero.h"

namespace tidal::engine {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool offload_to_cpu = false;
};

class ShardedAdamW {
 public:
  explicit ShardedAdamW(AdamWOptions options) : options_(options) {}

  // One update with learning rate `lr`; every gradient is first multiplied by `grad_scale`
  // (the clipping coefficient). Same arithmetic as torch.optim.AdamW (foreach=False).
  void Step(const std::vector<TrainableSlice>& slices, double lr, double grad_scale);

  int64_t steps() const { return steps_; }
  int64_t StateBytes() const;
  const AdamWOptions& options() const { return options_; }

  // The moments per slice key, for checkpoints; Restore replaces them and the step count
  // (which drives bias correction). Reset forgets everything (resume without optimizer state).
  struct State {
    torch::Tensor exp_avg, exp_avg_sq;
  };
  const std::map<std::string, State>& state() const { return state_; }
  void Restore(std::map<std::string, State> state, int64_t steps);
  void Reset();

 private:
  AdamWOptions options_;
  int64_t steps_ = 0;
  std::map<std::string, State> state_;
};

// Σ over slices of ‖grad‖², as a 0-dim fp64 tensor on their device (no host sync); the caller
// all-reduces it when the slices are partitioned.
torch::Tensor SquaredGradNorm(const std::vector<TrainableSlice>& slices);

}  // namespace tidal::engine
