// worker/engine/compression.h — top-k gradient compression with error feedback (Deep Gradient
// Compression, Lin et al. 2018; Stich et al. 2018), the pure part: one bucket's selection.
//
// A bucket is one block's trainable flat. For compression group g (a fixed share of the
// global batch's micro-batches, api/train_config.h GradientCompressionSpec) the gradient sent is
// the k entries of largest magnitude of u = g + e, where e is what the group did not send
// before; e becomes u with those k entries zeroed. Nothing of the gradient is lost, only
// delayed: sent + e_after = u = fp32(g) + e_before, entry by entry, with u rounded once.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace tidal::engine {

// The entries sent out of a bucket of `numel` at `ratio`: ceil(ratio × numel), at least 1.
int64_t TopKCount(int64_t numel, double ratio);

struct SparseGradient {
  torch::Tensor indices;  // int64 [k], into the bucket
  torch::Tensor values;   // fp32 [k], u at those indices
};

// Selects the k entries of largest |gradient + residual| (fp32, 1-D, the same size) and returns
// them; *residual becomes the rest (a new tensor: the caller commits it when the step does).
// k == numel sends everything, in index order, and leaves a zero residual.
SparseGradient TopKWithFeedback(const torch::Tensor& gradient, const torch::Tensor& residual,
                                int64_t k, torch::Tensor* next_residual);

// One rank's message for a block: for each of its groups, k indices then k values (the fp32
// bits), as int32 — one tensor a single all-gather moves. The bucket must have fewer than 2^31
// elements (ShardedParameters checks it).
torch::Tensor PackSparse(const std::vector<SparseGradient>& groups);
// Σ over every group's message in `gathered` (groups × 2k int32, rank order = group order),
// added in fp64 into `dense` (fp64, at least as long as the largest index + 1).
void AddPackedInto(const torch::Tensor& gathered, int64_t k, torch::Tensor& dense);

}  // namespace tidal::engine
