// worker/engine/optimizer.cc
#include "worker/engine/optimizer.h"

#include <cmath>

namespace tidal::engine {

void ShardedAdamW::Step(const std::vector<TrainableSlice>& slices, double lr, double grad_scale) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  for (const TrainableSlice& s : slices) {
    const torch::Device state_device = options_.offload_to_cpu ? torch::kCPU : s.param.device();
    auto [it, inserted] = state_.try_emplace(s.key);
    State& st = it->second;
    if (inserted) {
      auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(state_device);
      st.exp_avg = torch::zeros({s.param.numel()}, opts);
      st.exp_avg_sq = torch::zeros({s.param.numel()}, opts);
    }
    const bool offloaded = state_device != s.param.device();
    torch::Tensor param = offloaded ? s.param.to(state_device) : s.param;
    torch::Tensor grad = s.grad.to(state_device);
    if (grad_scale != 1.0) grad = grad * grad_scale;
    if (options_.weight_decay != 0) param.mul_(1.0 - lr * options_.weight_decay);
    st.exp_avg.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
    st.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    auto denom = (st.exp_avg_sq.sqrt() / bias2_sqrt).add_(options_.eps);
    param.addcdiv_(st.exp_avg, denom, -step_size);
    if (offloaded) s.param.copy_(param);
  }
}

void ShardedAdamW::Restore(std::map<std::string, State> state, int64_t steps) {
  state_ = std::move(state);
  steps_ = steps;
}

void ShardedAdamW::Reset() {
  state_.clear();
  steps_ = 0;
}

int64_t ShardedAdamW::StateBytes() const {
  int64_t bytes = 0;
  for (const auto& [key, st] : state_) bytes += (st.exp_avg.numel() + st.exp_avg_sq.numel()) * 4;
  return bytes;
}

torch::Tensor SquaredGradNorm(const std::vector<TrainableSlice>& slices) {
  torch::Tensor sum;
  for (const auto& s : slices) {
    auto part = s.grad.to(torch::kFloat64).pow(2).sum();
    sum = sum.defined() ? sum + part : part;
  }
  return sum.defined() ? sum : torch::zeros({}, torch::kFloat64);
}

}  // namespace tidal::engine
