// worker/engine/compression.cc
#include "worker/engine/compression.h"

#include <algorithm>
#include <cmath>

namespace tidal::engine {

int64_t TopKCount(int64_t numel, double ratio) {
  if (numel <= 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(numel));
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, numel);
}

SparseGradient TopKWithFeedback(const torch::Tensor& gradient, const torch::Tensor& residual,
                                int64_t k, torch::Tensor* next_residual) {
  torch::NoGradGuard no_grad;
  torch::Tensor u = gradient.to(torch::kFloat32) + residual;
  const int64_t n = u.numel();
  SparseGradient out;
  if (k >= n) {
    out.indices = torch::arange(n, u.options().dtype(torch::kInt64));
    out.values = u;
    *next_residual = torch::zeros_like(u);
    return out;
  }
  out.indices = std::get<1>(u.abs().topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false));
  out.values = u.index_select(0, out.indices);
  *next_residual = u.index_fill_(0, out.indices, 0.0);
  return out;
}

torch::Tensor PackSparse(const std::vector<SparseGradient>& groups) {
  std::vector<torch::Tensor> parts;
  for (const SparseGradient& g : groups) {
    parts.push_back(g.indices.to(torch::kInt32));
    parts.push_back(g.values.to(torch::kFloat32).contiguous().view(torch::kInt32));
  }
  return torch::cat(parts);
}

void AddPackedInto(const torch::Tensor& gathered, int64_t k, torch::Tensor& dense) {
  torch::NoGradGuard no_grad;
  auto per_group = gathered.view({-1, 2, k});
  auto indices = per_group.select(1, 0).reshape({-1}).to(torch::kInt64);
  auto values = per_group.select(1, 1).contiguous().view(torch::kFloat32).reshape({-1});
  dense.index_add_(0, indices.to(dense.device()), values.to(dense.options()));
}

}  // namespace tidal::engine
