// worker/engine/zero_internal.h — ShardedParameters' own records, shared by its files and
// nothing else: zero.cc (the parameters, the step's forward, gradients and update),
// zero_compression.cc (gradient compression and its exchange thread), zero_load.cc (loading
// the shards, and reading ahead what the next generation's shards need).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/engine/compression.h"
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
  // Gradient compression (stages 0-2). The local gradient of the group in flight, summed in
  // fp64 over its micro-batches straight from the leaves' gradient hooks ([padded], scaled as
  // the loss is); per group of this rank, the residual (fp32 [numel], unscaled), the one this
  // step leaves (committed by FinishStep) and what the group sends; the entries a group sends;
  // the last group compressed in this step (-1: none) and the leaves whose gradient arrived in
  // the micro-batch under way.
  torch::Tensor group_sum;
  std::vector<torch::Tensor> residual, next_residual;
  std::vector<SparseGradient> sent;
  torch::Tensor message;  // every group's `sent`, packed (PackSparse)
  int64_t k = 0;
  int64_t compressed_group = -1;
  size_t arrived = 0;
};

// The thread that all-gathers each block's messages once they are packed, in descending block
// order (the order backward completes them, and the same on every rank).
struct ShardedParameters::Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> ready;  // per block: its message is packed
  bool open = false;        // exchanges may start
  bool abort = false;
  Status status;
  std::thread thread;
};

}  // namespace tidal::engine
