// worker/engine/zero.h — ZeRO stages 0–3 applied to the plain DecoderModel from outside.
//
// Every block's parameters are laid out in two flat buffers, padded to a multiple of the world
// size W: frozen base weights (compute dtype) and trainable LoRA weights (fp32 — they are the
// optimizer's master weights; forward casts them to the compute dtype).
//   stage 0: every rank keeps everything; gradients are all-reduced; every rank updates all.
//   stage 1: + each rank updates only its 1/W slice of the trainable weights (its optimizer
//            state covers only that slice); gradients reduce-scattered at the step boundary;
//            updated slices all-gathered.
//   stage 2: + gradients reduce-scattered after every micro-batch, so only the 1/W slice of
//            the gradient is accumulated.
//   stage 3: + each rank keeps only its 1/W slice of every parameter, frozen ones included. A
//            block's parameters are all-gathered just before its forward, freed after, and
//            gathered again in backward, where the block is recomputed (so no activations
//            but the block inputs are kept) and its gradient reduce-scattered at once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "worker/engine/comm.h"
#include "worker/engine/compression_hook.h"
#include "worker/engine/model.h"

namespace tidal::engine {

struct ShardingOptions {
  int stage = 3;
  torch::Device device = torch::kCPU;
  torch::ScalarType compute_dtype = torch::kFloat32;
  // The frozen base weights' storage is allocated by Load, block by block, rather than up
  // front: a kept engine's next generation, whose old shards are freed as the new ones fill,
  // so the two never coexist beyond one block.
  bool allocate_frozen_in_load = false;
  // Top-k gradient compression with error feedback (GradientCompressionHook), stages 0-2:
  // the job's compression groups (a multiple of the world size, each rank holding its share of
  // them; 0: off) and the share of each block's gradient entries a group sends.
  int64_t compression_groups = 0;
  double compression_ratio = 1.0;
};

// Reads elements [first, first + count) of the row-major flattening of a parameter, in any
// dtype (Load converts into the parameter's).
using ParameterReader =
    std::function<StatusOr<torch::Tensor>(const ParamSpec& spec, int64_t first, int64_t count)>;

// One rank's share of the trainable weights, as the optimizer sees it.
struct TrainableSlice {
  std::string key;      // stable name for optimizer state ("block.7")
  torch::Tensor param;  // fp32 view this rank updates
  torch::Tensor grad;   // fp32 gradient for exactly those elements (after reduction)
};

// Where the trainable weights live, for checkpoints: per block, the parameters laid out in
// the block's flat buffer, and which element ranges of that flat this rank holds (`held`: the
// weights it keeps between steps), updates (`optimizer`: what its AdamW state covers) and
// saves (`owned`: its 1/W, the same split at every stage so all ranks share the writing).
struct FlatParamLayout {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // first element in the flat
  int64_t numel = 0;
};
struct TrainableBlockLayout {
  int64_t block = 0;
  std::string key;  // the optimizer's key, "block.<b>"
  std::vector<FlatParamLayout> params;
  int64_t numel = 0, padded = 0;
  int64_t held_lo = 0, held_hi = 0;
  int64_t optimizer_lo = 0, optimizer_hi = 0;
  int64_t owned_lo = 0, owned_hi = 0;
};

// This rank's frozen base weights, taken from one generation's parameters when it ends and
// handed to the next generation's Load: what the new shard shares with the old one is copied in
// memory instead of read again. Per block, the flat elements [lo, lo + data.numel()).
struct KeptBaseWeights {
  // Elements [lo, lo + data.numel()) of a block's frozen flat.
  struct Segment {
    int64_t lo = 0;
    torch::Tensor data;
  };
  struct Block {
    int64_t lo = 0;
    torch::Tensor data;
    // Read ahead for the next generation while the last one trained (ReadAheadBaseWeights),
    // on the host: parts of the next shard that `data` lacks.
    std::vector<Segment> ahead;
  };
  std::vector<Block> blocks;
  // Filled by Load: elements copied from here, and read from the source instead.
  int64_t reused = 0, read = 0;
  // Filled by Load: a block's old base weights where the new shard was taken over whole, so
  // nothing new was allocated for it. Not freed there: returning some hundred MB to the kernel
  // takes tens of ms, which the caller spends off the pause (Trainer frees them on a thread of
  // its own). Where Load allocates and copies, it frees each block's as it goes, so that the
  // peak holds at most one block of both.
  std::vector<torch::Tensor> retired;
};

// Where a rank sits; what it holds of every frozen flat follows (all of it below stage 3).
struct ShardPlacement {
  int stage = 0;
  int rank = 0;
  int world_size = 1;
};

// The frozen elements `to` will hold and `from` does not, per block, read now with `read` into
// host tensors of `dtype`. Called while a generation trains, for the next one's Load (as
// KeptBaseWeights::Block::ahead): that Load then copies them instead of reading in the pause
// between generations. Once `cancelled` returns true (checked between reads) it stops and
// returns what it has read; `complete` (may be null) says whether that is everything.
StatusOr<std::vector<std::vector<KeptBaseWeights::Segment>>> ReadAheadBaseWeights(
    const DecoderModel& model, ShardPlacement from, ShardPlacement to, torch::ScalarType dtype,
    const ParameterReader& read, const std::function<bool()>& cancelled, bool* complete = nullptr);

// What a read ahead from `from` to `to` holds in host memory, in elements: the frozen elements
// ReadAheadBaseWeights reads, and those of the whole next shard AssembleNextShards builds
// (stage 3; 0 below it, where the kept base is taken over as it is).
struct ReadAheadSize {
  int64_t read = 0;
  int64_t assembled = 0;
};
ReadAheadSize SizeOfReadAhead(const DecoderModel& model, ShardPlacement from, ShardPlacement to);

// How much of a read ahead of `size` (elements of `element_bytes`) a host-memory budget of
// `budget_bytes` allows: assembling needs the segments and the assembled shard to fit together
// (an upper bound: each block's segments go once its shard is built), reading alone the
// segments. The reader's own temporaries (one parameter at a time) are not counted.
enum class ReadAheadFit { kReadAndAssemble, kReadOnly, kNothing };
ReadAheadFit FitReadAhead(ReadAheadSize size, int64_t element_bytes, int64_t budget_bytes);

// Where the device is the host, the next generation's whole stage-3 shard per block, built
// while this one trains: [rank·slice, (rank+1)·slice) of each frozen flat (slice the padded
// flat over the world size, the padding zero), filled from `current` (this rank's shard now,
// ShardedParameters::FrozenShards) where the two overlap and from `ahead` (what
// ReadAheadBaseWeights read) elsewhere. The next Load then takes each over without a copy.
// Blocks are assembled until `cancelled`; a block left out keeps its segments as they were.
// Both shards are held at once meanwhile.
void AssembleNextShards(const DecoderModel& model, ShardPlacement to,
                        const std::vector<KeptBaseWeights::Segment>& current,
                        std::vector<std::vector<KeptBaseWeights::Segment>>& ahead,
                        const std::function<bool()>& cancelled);

class ShardedParameters {
 public:
  ShardedParameters(const DecoderModel& model, Comm& comm, ShardingOptions options);
  ~ShardedParameters();

  // Fills this rank's share of every parameter. Each rank reads only the ranges it keeps.
  // `progress`, when set, is called after each read with the elements loaded so far and the
  // elements this rank will load in all.
  using LoadProgress = std::function<void(int64_t loaded, int64_t total)>;
  // With `kept` (the last generation's base weights of this process), the frozen elements it
  // holds are copied from it and only the rest are read; a kept block that is exactly the new
  // one (stages 0-2, where every rank holds the whole base; or the same shard at stage 3) is
  // taken over without a copy. Segments read ahead (KeptBaseWeights::Block::ahead) are copied
  // as well. Each kept block is released once used: with
  // allocate_frozen_in_load the two generations' shards never coexist beyond one block.
  // Trainable weights always come from `read` (their initial values: a resume overwrites them).
  Status Load(const ParameterReader& read, const LoadProgress& progress = {},
              KeptBaseWeights* kept = nullptr);
  // Moves this rank's frozen base weights out, for the next generation's Load; these
  // parameters are unusable after it.
  KeptBaseWeights ReleaseBaseWeights();
  // Per block, this rank's frozen shard now (the tensors themselves, never written: safe to
  // read from another thread while this one trains).
  std::vector<KeptBaseWeights::Segment> FrozenShards() const;

  // Runs the whole model on one micro-batch. With ctx.targets: the summed token loss (fp32
  // scalar, differentiable w.r.t. the trainable weights); without: logits. An out-of-memory
  // is thrown as it came (c10::OutOfMemoryError), every other error returned.
  StatusOr<torch::Tensor> Forward(const ForwardContext& ctx);
  // Drops the gradients of the micro-batches run since the last step (no collective): a step
  // abandoned before its reduction, to be run again.
  void DiscardGradients();

  // After each micro-batch's backward: stage 2 reduce-scatters the gradient into the slice.
  Status AfterMicroBatchBackward();
  // At the step boundary: finishes the gradient reduction and returns this rank's slices.
  StatusOr<std::vector<TrainableSlice>> ReduceGradients();
  // After the optimizer wrote the slices: stages 1–2 all-gather the updated weights; clears
  // gradients. `keep_residuals` false (a step whose update was skipped): a compressed step's
  // residuals are those it started with.
  Status FinishStep(bool keep_residuals = true);

  // Gradient compression (options().compression_groups > 0 below stage 3): the hook the
  // trainable leaves' gradients go to, which fills the blocks' step gradients
  // (GradientCompressionHook says how a step drives it). BeginStep starts every step (`compress`
  // false, or no hook: the plain reduction); SetMicroBatchGroup before each micro-batch's
  // backward under compression.
  void BeginStep(bool compress, double loss_scale, bool overlap);
  void SetMicroBatchGroup(int64_t group, bool last) {
    if (compression_) compression_->SetMicroBatchGroup(group, last);
  }
  bool compressing() const { return compression_ && compression_->active(); }
  using GradientTraffic = engine::GradientTraffic;
  // This step's gradient traffic so far (dense or compressed).
  const GradientTraffic& traffic() const { return traffic_; }
  // Residuals, for checkpoints: this rank's groups are [first_group(), first_group() +
  // local_groups()) of compression_groups(); block b's residual of group g is fp32 [the
  // trainable flat's elements].
  int64_t compression_groups() const { return options_.compression_groups; }
  int64_t local_groups() const {
    return options_.compression_groups > 0 ? options_.compression_groups / comm_.world_size() : 0;
  }
  int64_t first_group() const { return comm_.rank() * local_groups(); }
  StatusOr<torch::Tensor> Residual(int64_t block, int64_t group) const;
  // Every residual of this rank back to zero (a resume from a checkpoint without them).
  void ClearResiduals() {
    if (compression_) compression_->ClearResiduals();
  }
  Status SetResidual(int64_t block, int64_t group, const torch::Tensor& values);

  // Whether the squared gradient norms of this rank's slices must be summed over ranks.
  bool slices_are_partitioned() const { return options_.stage >= 1 && comm_.world_size() > 1; }

  // Every parameter at full size (collective: every rank must call it). For export and tests.
  StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> GatherFull() {
    return Gather(/*trainable_only=*/false);
  }
  // The LoRA weights only, at full size (collective); never materialises the base weights.
  StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> GatherTrainable() {
    return Gather(/*trainable_only=*/true);
  }

  // Bytes of parameter storage this rank holds now (unique storages of every tensor kept
  // between steps), measured on the tensors, not computed from shapes.
  int64_t ResidentParameterBytes() const;
  // Bytes all parameters take at full size, and the largest single block.
  int64_t TotalParameterBytes() const;
  int64_t LargestBlockBytes() const;
  int64_t TrainableParameterCount() const;
  // A hash of the bytes of this rank's frozen base weights: equal before and after training
  // when the base is untouched bit for bit.
  uint64_t FrozenChecksum() const;

  const ShardingOptions& options() const { return options_; }

  // Checkpoint access to the trainable flats (blocks without trainable weights are left out).
  std::vector<TrainableBlockLayout> TrainableLayout() const;
  // fp32 copy of elements [lo, hi) of block b's trainable flat; they must lie in its held range.
  StatusOr<torch::Tensor> TrainableRange(int64_t block, int64_t lo, int64_t hi) const;
  // Overwrites block b's held range with `values` (fp32, held_hi − held_lo elements).
  Status SetTrainableHeld(int64_t block, const torch::Tensor& values);

 private:
  struct Flat;
  struct Block;
  friend struct GatheredBlockFunction;

  StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> Gather(bool trainable_only);
  int64_t HeldSize(const Flat& flat, bool trainable) const;
  torch::Tensor RunBlock(int64_t b, const torch::Tensor& x);
  // Full-size views of block b's parameters (gathering under stage 3); `holder` keeps the
  // gathered storage alive for as long as the views are used.
  StatusOr<std::vector<torch::Tensor>> BlockParams(int64_t b, bool trainable_requires_grad,
                                                   std::vector<torch::Tensor>& holder,
                                                   torch::Tensor* trainable_full_out);
  StatusOr<torch::Tensor> GatherFlat(const Flat& flat, torch::ScalarType dtype);
  torch::Tensor EmbeddingForHead(std::vector<torch::Tensor>& holder);

  const DecoderModel& model_;
  Comm& comm_;
  ShardingOptions options_;
  std::vector<std::unique_ptr<Block>> blocks_;
  ForwardContext ctx_;       // the micro-batch in flight; stage-3 backward recomputes with it
  GradientTraffic traffic_;  // this step's
  // After blocks_: destroyed (its exchange stopped) before the gradients it writes.
  std::unique_ptr<GradientCompressionHook> compression_;
};

}  // namespace tidal::engine
