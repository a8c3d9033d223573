// worker/engine/torch_compat.h — the one place where LibTorch version differences live.
// Debian's libtorch-dev is 1.13 (CPU, gloo); GPU hosts use the LibTorch inside PyTorch 2.x.
// Everything else in the engine calls these wrappers instead of version-specific APIs.
#pragma once

#include <cstdint>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <torch/version.h>
#ifdef TIDAL_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

// The object collectives are called on: in 1.13 a gloo/NCCL process group *is* a
// c10d::ProcessGroup; from 2.0 it is a c10d::Backend (ProcessGroup became a dispatcher over
// backends). Both have the same allreduce/allgather/broadcast/barrier/_*_base methods.
namespace c10d {
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace tidal::engine::compat {

#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// A generator seeded with `seed` on `device`'s backend, for masks that must be a pure
// function of a key (LoRA dropout is recomputed in ZeRO-3 backward and must not depend on
// how micro-batches are spread over ranks).
inline at::Generator MakeGenerator(uint64_t seed, const torch::Device& device) {
#ifdef TIDAL_WITH_CUDA
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::createCUDAGenerator(device.index());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  (void)device;
  return at::detail::createCPUGenerator(seed);
}

// Causal self-attention over [batch, heads, seq, head_dim]. PyTorch 2 has a fused kernel
// (flash / memory-efficient on GPU); 1.13 gets the textbook formulation, with `causal_mask`
// ([seq, seq] bool, true above the diagonal) built once per forward by the caller when given.
inline torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& causal_mask) {
#if TORCH_VERSION_MAJOR >= 2
  (void)causal_mask;
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t seq = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto mask =
      causal_mask.defined()
          ? causal_mask.narrow(0, 0, seq).narrow(1, 0, seq)
          : torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                .triu(1);
  auto scores = torch::matmul(q, k.transpose(-2, -1)).mul_(scale);
  scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores.to(torch::kFloat32), -1).to(q.scalar_type());
  return torch::matmul(probs, v);
#endif
}

inline bool CudaAvailable() {
#ifdef TIDAL_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace tidal::engine::compat
