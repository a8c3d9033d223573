// worker/engine/torch_compat.h — the few LibTorch calls that differ between CPU and CUDA builds
// of PyTorch 2.x (the project builds against the torch wheel's LibTorch, tools/requirements.txt).
// Everything else in the engine calls these wrappers.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#ifdef TIDAL_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace tidal::engine::compat {

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

// Causal self-attention over [batch, heads, seq, head_dim]: PyTorch's fused kernel (flash or
// memory-efficient on GPU, a blocked kernel on CPU).
// `scale` defaults to 1/√head_dim; q and k may have more features than v (DeepSeek's MLA).
inline torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v,
                                     std::optional<double> scale = std::nullopt) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, scale);
}

// Attention over [batch, heads, seq, head_dim] where `mask` ([batch, 1, seq, seq] bool) says
// which keys each query sees: packed documents (the memory-efficient kernel on GPU; flash
// attention takes no mask).
inline torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& mask,
                                     std::optional<double> scale = std::nullopt) {
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          scale);
}

// Whether this build has CUDA and a GPU is there to use.
inline bool CudaAvailable() {
#ifdef TIDAL_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace tidal::engine::compat
