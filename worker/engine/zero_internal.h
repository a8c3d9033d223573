// worker/engine/zero_internal.h — ShardedParameters' own records, shared by its files and
// nothing else: zero.cc (the parameters, the step's forward, gradients and update) and
// zero_load.cc (loading the shards, and reading ahead what the next generation's shards need).
// Gradient compression is a hook of its own (compression_hook.h).
#pragma once

#include <vector>

#include "worker/engine/zero.h"

namespace tidal::engine {

// One flat buffer: which parameters of the block it holds and where.
struct ShardedParameters::Flat {
  std::vector<size_t> param_index;  // into BlockSpec::params
  std::vector<int64_t> offset;
  int64_t numel = 0;   // unpadded
  int64_t padded = 0;  // a multiple of the world size
  // This rank's [padded / W] slice at stage 3; below, [padded] trainable or [numel] frozen.
  torch::Tensor data;
};

struct ShardedParameters::Block {
  Flat frozen;
  Flat trainable;
  // Stages 0–2: one leaf per trainable parameter, aliasing `trainable.data`, whose .grad is a
  // view of `grad` — autograd accumulates straight into the flat gradient that the
  // collectives reduce (no per-view scatter, no copy).
  std::vector<torch::Tensor> leaves;
  torch::Tensor grad;  // stages 0–2: [padded] fp32, one micro-batch's
  // The step's gradient, summed in fp64 over micro-batches and ranks: [padded] at stages 0–1,
  // this rank's [padded / W] slice at stages 2–3. The fp32 gradients of one micro-batch are
  // the same at any world size; their fp64 sum is exact but in rare cases, so its rounding to
  // fp32 is the same whatever order the micro-batches and the collective add them in. The
  // curve of a job that rescales is then the curve of one that never did, step for step.
  torch::Tensor grad_sum;
};

}  // namespace tidal::engine
