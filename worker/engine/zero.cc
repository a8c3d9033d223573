// worker/engine/zero.cc
#include "worker/engine/zero.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "worker/engine/compression.h"

namespace tidal::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

namespace {

// Throws out of autograd (which cannot carry a Status); the trainer catches it around
// backward() and turns it back into the Status.
void ThrowIfError(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

}  // namespace

// The stage-3 block: forward gathers the block's parameters, runs it without keeping the
// graph and frees them; backward gathers again, recomputes the block with the graph, and
// returns the input gradient and this rank's reduce-scattered slice of the weight gradient.
struct GatheredBlockFunction : public torch::autograd::Function<GatheredBlockFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor trainable_slice,
                               ShardedParameters* self, int64_t block) {
    (void)trainable_slice;  // an input only so that autograd routes its gradient here
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["block"] = block;
    ctx->save_for_backward({x});
    std::vector<torch::Tensor> holder;
    auto params = self->BlockParams(block, false, holder, nullptr);
    ThrowIfError(params.status());
    torch::Tensor embedding;
    if (self->model_.blocks()[block].kind == BlockKind::kHead && self->model_.head_uses_embedding())
      embedding = self->EmbeddingForHead(holder);
    return self->model_.ForwardBlock(block, *params, x, self->ctx_, embedding);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* self = reinterpret_cast<ShardedParameters*>(ctx->saved_data["self"].toInt());
    const int64_t block = ctx->saved_data["block"].toInt();
    const bool x_needs_grad = ctx->needs_input_grad(0);
    const bool w_needs_grad = ctx->needs_input_grad(1);
    // The engine runs backward with grad mode off; the recompute, including taking the
    // parameter views, must record a graph.
    torch::AutoGradMode enable(true);
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(x_needs_grad);
    std::vector<torch::Tensor> holder;
    torch::Tensor trainable_full;
    auto params = self->BlockParams(block, w_needs_grad, holder, &trainable_full);
    ThrowIfError(params.status());
    torch::Tensor embedding;
    if (self->model_.blocks()[block].kind == BlockKind::kHead && self->model_.head_uses_embedding())
      embedding = self->EmbeddingForHead(holder);
    torch::Tensor y = self->model_.ForwardBlock(block, *params, x, self->ctx_, embedding);
    std::vector<torch::Tensor> inputs;
    if (x_needs_grad) inputs.push_back(x);
    if (w_needs_grad) inputs.push_back(trainable_full);
    auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::Tensor dx = x_needs_grad ? grads[0] : torch::Tensor();
    torch::Tensor dslice;
    if (w_needs_grad) {
      auto full = grads.back();
      // fp32 first (the gradient as one rank computes it), then summed in fp64: grad_sum.
      full = full.defined() ? full.to(torch::kFloat32).to(torch::kFloat64)
                            : torch::zeros_like(trainable_full, torch::kFloat64);
      ShardedParameters::Block& b = *self->blocks_[block];
      auto slice = torch::empty_like(b.grad_sum);
      ThrowIfError(self->comm_.ReduceScatterSum(full, slice));
      b.grad_sum.add_(slice);
    }
    // The trainable slice's gradient is in grad_sum, not autograd's: none returned for it.
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

ShardedParameters::ShardedParameters(const DecoderModel& model, Comm& comm, ShardingOptions options)
    : model_(model), comm_(comm), options_(options) {
  const int64_t world = comm_.world_size();
  const bool sharded = options_.stage == 3;
  for (const BlockSpec& spec : model_.blocks()) {
    auto block = std::make_unique<Block>();
    for (size_t i = 0; i < spec.params.size(); ++i) {
      Flat& flat = spec.params[i].trainable ? block->trainable : block->frozen;
      flat.param_index.push_back(i);
      flat.offset.push_back(flat.numel);
      flat.numel += spec.params[i].numel();
    }
    for (Flat* flat : {&block->frozen, &block->trainable}) {
      flat->padded = (flat->numel + world - 1) / world * world;
      const bool trainable = flat == &block->trainable;
      if (!trainable && options_.allocate_frozen_in_load) continue;
      const int64_t kept = HeldSize(*flat, trainable);
      auto opts = torch::TensorOptions()
                      .device(options_.device)
                      .dtype(trainable ? torch::kFloat32 : options_.compute_dtype);
      flat->data = torch::zeros({kept}, opts);
      // Stage 3: the slice itself is the leaf; the gathered-block function routes its
      // gradient there.
      if (trainable && flat->numel > 0 && sharded) flat->data.set_requires_grad(true);
    }
    Flat& t = block->trainable;
    if (!sharded && t.numel > 0) {
      block->grad = torch::zeros({t.padded}, t.data.options());
      for (size_t k = 0; k < t.param_index.size(); ++k) {
        const ParamSpec& p = spec.params[t.param_index[k]];
        auto leaf = t.data.narrow(0, t.offset[k], p.numel()).view(p.shape).detach();
        leaf.requires_grad_(true);
        leaf.mutable_grad() = block->grad.narrow(0, t.offset[k], p.numel()).view(p.shape);
        block->leaves.push_back(std::move(leaf));
      }
    }
    if (t.numel > 0)
      block->grad_sum =
          torch::zeros({options_.stage >= 2 ? t.padded / world : t.padded},
                       torch::TensorOptions().device(options_.device).dtype(torch::kFloat64));
    if (options_.compression_groups > 0 && !sharded && t.numel > 0) {
      if (t.numel > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("gradient compression: block " +
                                    std::to_string(blocks_.size()) + " has " +
                                    std::to_string(t.numel) +
                                    " trainable elements, more than the 2^31 its indices address");
      block->group_sum = torch::zeros({t.padded}, block->grad_sum.options());
      for (int64_t g = 0; g < local_groups(); ++g)
        block->residual.push_back(torch::zeros({t.numel}, t.data.options()));
      block->next_residual.resize(block->residual.size());
      block->sent.resize(block->residual.size());
      for (size_t k = 0; k < t.param_index.size(); ++k)
        block->k += TopKCount(spec.params[t.param_index[k]].numel(), options_.compression_ratio);
      const size_t b = blocks_.size();
      for (size_t k = 0; k < block->leaves.size(); ++k)
        block->leaves[k].register_hook(
            [this, b, k](const torch::Tensor& grad) { return OnLeafGradient(b, k, grad); });
    }
    blocks_.push_back(std::move(block));
  }
}

ShardedParameters::~ShardedParameters() { (void)StopExchange(/*abort=*/true); }

int64_t ShardedParameters::local_groups() const {
  return options_.compression_groups > 0 ? options_.compression_groups / comm_.world_size() : 0;
}

void ShardedParameters::BeginStep(bool compress, double loss_scale, bool overlap) {
  (void)StopExchange(/*abort=*/true);  // a step given up before its reduction
  traffic_ = {};
  compressing_ = compress && options_.compression_groups > 0 && options_.stage < 3;
  overlap_ = overlap;
  scale_ = loss_scale;
  group_ = 0;
  last_of_group_ = false;
  if (!compressing_) return;
  for (auto& block : blocks_) {
    block->compressed_group = -1;
    block->arrived = 0;
    if (block->group_sum.defined()) block->group_sum.zero_();
  }
  exchange_ = std::make_unique<Exchange>();
  exchange_->ready.assign(blocks_.size(), 0);
  exchange_->open = overlap;
  exchange_->thread = std::thread([this] { ExchangeLoop(); });
}

void ShardedParameters::SetMicroBatchGroup(int64_t group, bool last) {
  group_ = group;
  last_of_group_ = last;
  for (auto& block : blocks_) block->arrived = 0;
}

// On the thread running backward, once per micro-batch for each leaf: the gradient goes into
// the group's fp64 sum; in the group's last micro-batch, the block whose leaves have all arrived
// is compressed at once (and, in this rank's last group with overlap, its exchange starts while
// backward goes on through the blocks below). Returns no tensor: autograd's own accumulation
// into the block's flat gradient goes on and is dropped after the micro-batch.
torch::Tensor ShardedParameters::OnLeafGradient(size_t b, size_t k, const torch::Tensor& grad) {
  if (!compressing_) return {};
  torch::NoGradGuard no_grad;
  Block& block = *blocks_[b];
  const Flat& t = block.trainable;
  block.group_sum.narrow(0, t.offset[k], grad.numel()).add_(grad.reshape({-1}).to(torch::kFloat64));
  if (last_of_group_ && ++block.arrived == block.leaves.size()) CompressBlock(b, group_);
  return {};
}

void ShardedParameters::CompressBlock(size_t b, int64_t group) {
  Block& block = *blocks_[b];
  if (block.compressed_group >= group) return;  // done in its hook
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor local = block.group_sum.narrow(0, 0, block.trainable.numel);
  if (scale_ != 1.0) local = local / scale_;  // a power of two: exact
  // A bucket per parameter (each LoRA A and B its own share: their gradients' scales differ by
  // orders of magnitude, and one selection over the block would starve the smaller).
  const Flat& t = block.trainable;
  std::vector<torch::Tensor> indices, values, rest;
  for (size_t p = 0; p < t.param_index.size(); ++p) {
    const int64_t at = t.offset[p];
    const int64_t n = (p + 1 < t.param_index.size() ? t.offset[p + 1] : t.numel) - at;
    torch::Tensor next;
    SparseGradient part =
        TopKWithFeedback(local.narrow(0, at, n), block.residual[group].narrow(0, at, n),
                         TopKCount(n, options_.compression_ratio), &next);
    indices.push_back(part.indices + at);
    values.push_back(part.values);
    rest.push_back(next);
  }
  block.sent[group] = {torch::cat(indices), torch::cat(values)};
  block.next_residual[group] = torch::cat(rest);
  block.group_sum.zero_();
  block.compressed_group = group;
  if (group == local_groups() - 1) {
    block.message = PackSparse(block.sent).to(comm_.device());
    std::lock_guard<std::mutex> lock(exchange_->mu);
    exchange_->ready[b] = 1;
    exchange_->cv.notify_all();
  }
  traffic_.compress_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ShardedParameters::ExchangeLoop() {
  torch::NoGradGuard no_grad;
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (blocks_[i]->trainable.numel == 0) continue;
    {
      std::unique_lock<std::mutex> lock(exchange_->mu);
      exchange_->cv.wait(
          lock, [&] { return exchange_->abort || (exchange_->open && exchange_->ready[i]); });
      if (exchange_->abort) return;
    }
    Status status;
    try {
      status = ExchangeBlock(i);
    } catch (const std::exception& e) {
      status = Unavailable(std::string("gradient exchange: ") + e.what());
    }
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(exchange_->mu);
      exchange_->status = status;
      return;
    }
  }
}

// Every rank's messages for block b, gathered in rank order (= group order), summed in fp64
// into the step's gradient: the whole flat at stages 0-1, this rank's slice at stage 2.
Status ShardedParameters::ExchangeBlock(size_t b) {
  Block& block = *blocks_[b];
  const Flat& t = block.trainable;
  const int64_t world = comm_.world_size();
  auto gathered = torch::empty({block.message.numel() * world}, block.message.options());
  TIDAL_RETURN_IF_ERROR(comm_.AllGather(block.message, gathered));
  auto dense = torch::zeros({t.padded}, block.grad_sum.options());
  AddPackedInto(gathered, block.k, dense);
  if (scale_ != 1.0) dense.mul_(scale_);
  if (options_.stage == 2)
    block.grad_sum.copy_(dense.narrow(0, comm_.rank() * (t.padded / world), t.padded / world));
  else
    block.grad_sum.copy_(dense);
  if (world > 1) traffic_.payload_bytes += block.message.numel() * 4;
  return OkStatus();
}

Status ShardedParameters::StopExchange(bool abort) {
  if (!exchange_) return OkStatus();
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    if (abort) exchange_->abort = true;
    exchange_->open = true;
    exchange_->cv.notify_all();
  }
  if (exchange_->thread.joinable()) exchange_->thread.join();
  Status status = exchange_->status;
  exchange_.reset();
  return status;
}

StatusOr<ShardedParameters::Block*> ShardedParameters::CompressedBlock(int64_t block,
                                                                       int64_t group) const {
  if (block < 0 || block >= static_cast<int64_t>(blocks_.size()) ||
      blocks_[block]->residual.empty())
    return NotFound("block " + std::to_string(block) + " has no compression residual");
  const int64_t g = group - first_group();
  if (g < 0 || g >= local_groups())
    return InvalidArgument("compression group " + std::to_string(group) +
                           " is not this rank's (it holds [" + std::to_string(first_group()) +
                           ", " + std::to_string(first_group() + local_groups()) + "))");
  return blocks_[block].get();
}

StatusOr<torch::Tensor> ShardedParameters::Residual(int64_t block, int64_t group) const {
  TIDAL_ASSIGN_OR_RETURN(Block * b, CompressedBlock(block, group));
  return b->residual[group - first_group()].to(torch::kCPU, torch::kFloat32, false, true);
}

void ShardedParameters::ClearResiduals() {
  torch::NoGradGuard no_grad;
  for (auto& block : blocks_)
    for (torch::Tensor& r : block->residual) r.zero_();
}

Status ShardedParameters::SetResidual(int64_t block, int64_t group, const torch::Tensor& values) {
  TIDAL_ASSIGN_OR_RETURN(Block * b, CompressedBlock(block, group));
  torch::Tensor& r = b->residual[group - first_group()];
  if (values.numel() != r.numel())
    return InvalidArgument("block " + std::to_string(block) + ": a residual of " +
                           std::to_string(values.numel()) + " elements for " +
                           std::to_string(r.numel()));
  torch::NoGradGuard no_grad;
  r.copy_(values.reshape({-1}));
  return OkStatus();
}

// Elements of `flat` this rank keeps: its 1/W at stage 3; below, all of them (padded to W where
// the collectives need it: trainable flats are reduced; frozen ones never are).
int64_t ShardedParameters::HeldSize(const Flat& flat, bool trainable) const {
  if (options_.stage == 3) return flat.padded / comm_.world_size();
  return trainable ? flat.padded : flat.numel;
}

Status ShardedParameters::Load(const ParameterReader& read, const LoadProgress& progress,
                               KeptBaseWeights* kept) {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  // What this rank keeps of each parameter: [begin, end) of its flat buffer, and their sum.
  const int64_t stage = options_.stage;
  auto kept_range = [&](const Flat& flat, bool trainable, size_t k, const ParamSpec& p) {
    const int64_t lo = stage == 3 ? rank * (flat.padded / world) : 0;
    const int64_t hi = lo + HeldSize(flat, trainable);
    return std::pair{std::max(lo, flat.offset[k]), std::min(hi, flat.offset[k] + p.numel())};
  };
  int64_t total = 0, loaded = 0;
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (const Flat* flat : {&blocks_[b]->frozen, &blocks_[b]->trainable})
      for (size_t k = 0; k < flat->param_index.size(); ++k) {
        const auto [begin, end] = kept_range(*flat, flat == &blocks_[b]->trainable, k,
                                             model_.blocks()[b].params[flat->param_index[k]]);
        total += std::max<int64_t>(0, end - begin);
      }
  if (kept && kept->blocks.size() != blocks_.size())
    return Internal("kept base weights of " + std::to_string(kept->blocks.size()) +
                    " blocks for a model of " + std::to_string(blocks_.size()));
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const BlockSpec& spec = model_.blocks()[b];
    // The last generation's copy of this block's frozen flat, where it can serve: same dtype
    // and device (the same job's engine always has them).
    KeptBaseWeights::Block* mine = nullptr;
    if (kept && kept->blocks[b].data.defined() &&
        kept->blocks[b].data.scalar_type() == options_.compute_dtype &&
        kept->blocks[b].data.device() == options_.device)
      mine = &kept->blocks[b];
    bool frozen_adopted = false;
    for (Flat* flat : {&blocks_[b]->frozen, &blocks_[b]->trainable}) {
      const int64_t lo = stage == 3 ? rank * (flat->padded / world) : 0;
      const bool frozen = flat == &blocks_[b]->frozen;
      // The kept block taken over as it is, when it is exactly this rank's new one (or one
      // assembled ahead is: AssembleNextShards).
      bool adopted = false;
      if (frozen && !flat->data.defined()) {
        const int64_t size = HeldSize(*flat, /*trainable=*/false);
        KeptBaseWeights::Segment* whole = nullptr;
        if (kept)
          for (KeptBaseWeights::Segment& s : kept->blocks[b].ahead)
            if (s.lo == lo && s.data.numel() == size &&
                s.data.scalar_type() == options_.compute_dtype &&
                s.data.device() == options_.device)
              whole = &s;
        if (mine && mine->lo == lo && mine->data.numel() == size) {
          flat->data = std::move(mine->data);
          mine->data = torch::Tensor();
          adopted = true;
        } else if (whole) {
          flat->data = std::move(whole->data);
          adopted = true;
        } else {
          flat->data = torch::zeros(
              {size}, torch::TensorOptions().device(options_.device).dtype(options_.compute_dtype));
        }
        frozen_adopted = adopted;
      }
      for (size_t k = 0; k < flat->param_index.size(); ++k) {
        const ParamSpec& p = spec.params[flat->param_index[k]];
        const auto [begin, end] = kept_range(*flat, !frozen, k, p);
        if (begin >= end) continue;
        if (adopted) {
          kept->reused += end - begin;
          loaded += end - begin;
          if (progress) progress(loaded, total);
          continue;
        }
        // [begin, end) in flat elements: what a kept source holds (the last generation's
        // shard, a segment read ahead) is copied, the gaps between them are read.
        std::vector<const KeptBaseWeights::Segment*> sources;
        KeptBaseWeights::Segment last;
        if (frozen && mine && mine->data.defined()) {
          last = {mine->lo, mine->data};
          sources.push_back(&last);
        }
        if (frozen && kept)
          for (const KeptBaseWeights::Segment& ahead : kept->blocks[b].ahead)
            sources.push_back(&ahead);
        for (int64_t at = begin; at < end;) {
          const KeptBaseWeights::Segment* holding = nullptr;
          int64_t gap_end = end;  // where the next source starts, when none holds `at`
          for (const KeptBaseWeights::Segment* src : sources) {
            if (src->lo <= at && at < src->lo + src->data.numel()) {
              holding = src;
              break;
            }
            if (src->lo > at) gap_end = std::min(gap_end, src->lo);
          }
          if (holding) {
            const int64_t to = std::min(end, holding->lo + holding->data.numel());
            flat->data.narrow(0, at - lo, to - at)
                .copy_(holding->data.narrow(0, at - holding->lo, to - at));
            kept->reused += to - at;
            at = to;
            continue;
          }
          auto values = read(p, at - flat->offset[k], gap_end - at);
          if (!values.ok()) return values.status();
          if (values->numel() != gap_end - at)
            return Internal("reader returned " + std::to_string(values->numel()) +
                            " elements for " + p.name + ", expected " +
                            std::to_string(gap_end - at));
          flat->data.narrow(0, at - lo, gap_end - at).copy_(values->reshape({-1}));
          if (kept && frozen) kept->read += gap_end - at;
          at = gap_end;
        }
        loaded += end - begin;
        if (progress) progress(loaded, total);
      }
    }
    if (kept) {  // one block of both at a time, at most
      KeptBaseWeights::Block& old = kept->blocks[b];
      if (old.data.defined() && frozen_adopted) kept->retired.push_back(std::move(old.data));
      old.data = torch::Tensor();
      for (KeptBaseWeights::Segment& s : old.ahead)
        if (frozen_adopted && s.data.defined()) kept->retired.push_back(std::move(s.data));
      old.ahead.clear();
    }
  }
  return OkStatus();
}

namespace {

// [lo, hi) of the frozen flat of `spec` (its frozen parameters in order) that `at` holds,
// within the flat's elements; the flat's size in `numel`.
std::pair<int64_t, int64_t> FrozenHeld(const BlockSpec& spec, ShardPlacement at, int64_t* numel) {
  int64_t n = 0;
  for (const ParamSpec& p : spec.params)
    if (!p.trainable) n += p.numel();
  *numel = n;
  if (at.stage != 3) return {0, n};
  const int64_t slice = (n + at.world_size - 1) / at.world_size;
  return {std::min(n, at.rank * slice), std::min(n, (at.rank + 1) * slice)};
}

}  // namespace

StatusOr<std::vector<std::vector<KeptBaseWeights::Segment>>> ReadAheadBaseWeights(
    const DecoderModel& model, ShardPlacement from, ShardPlacement to, torch::ScalarType dtype,
    const ParameterReader& read, const std::function<bool()>& cancelled, bool* complete) {
  torch::NoGradGuard no_grad;
  if (complete) *complete = false;
  std::vector<std::vector<KeptBaseWeights::Segment>> out(model.blocks().size());
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    const BlockSpec& spec = model.blocks()[b];
    int64_t numel = 0;
    const auto [old_lo, old_hi] = FrozenHeld(spec, from, &numel);
    const auto [new_lo, new_hi] = FrozenHeld(spec, to, &numel);
    // The new range less the old one: a part before it and a part after it.
    for (const auto& [lo, hi] : {std::pair{new_lo, std::min(new_hi, std::max(new_lo, old_lo))},
                                 std::pair{std::max(new_lo, std::min(new_hi, old_hi)), new_hi}}) {
      if (lo >= hi) continue;
      torch::Tensor segment = torch::empty({hi - lo}, torch::TensorOptions().dtype(dtype));
      int64_t offset = 0;
      for (const ParamSpec& p : spec.params) {
        if (p.trainable) continue;
        const int64_t begin = std::max(lo, offset), end = std::min(hi, offset + p.numel());
        if (begin < end) {
          if (cancelled && cancelled()) {  // keep what is read: this segment up to `begin`
            if (begin > lo) out[b].push_back({lo, segment.narrow(0, 0, begin - lo)});
            return out;
          }
          TIDAL_ASSIGN_OR_RETURN(torch::Tensor values, read(p, begin - offset, end - begin));
          if (values.numel() != end - begin)
            return Internal("reader returned " + std::to_string(values.numel()) + " elements for " +
                            p.name + ", expected " + std::to_string(end - begin));
          segment.narrow(0, begin - lo, end - begin).copy_(values.reshape({-1}));
        }
        offset += p.numel();
      }
      out[b].push_back({lo, std::move(segment)});
    }
  }
  if (complete) *complete = true;
  return out;
}

ReadAheadSize SizeOfReadAhead(const DecoderModel& model, ShardPlacement from, ShardPlacement to) {
  ReadAheadSize size;
  for (const BlockSpec& spec : model.blocks()) {
    int64_t numel = 0;
    const auto [old_lo, old_hi] = FrozenHeld(spec, from, &numel);
    const auto [new_lo, new_hi] = FrozenHeld(spec, to, &numel);
    const int64_t shared =
        std::max<int64_t>(0, std::min(old_hi, new_hi) - std::max(old_lo, new_lo));
    size.read += (new_hi - new_lo) - shared;
    if (to.stage == 3) size.assembled += (numel + to.world_size - 1) / to.world_size;
  }
  return size;
}

ReadAheadFit FitReadAhead(ReadAheadSize size, int64_t element_bytes, int64_t budget_bytes) {
  // In elements, so that no product of bytes overflows.
  const int64_t budget = std::max<int64_t>(0, budget_bytes) / std::max<int64_t>(1, element_bytes);
  if (size.read > budget) return ReadAheadFit::kNothing;
  if (size.assembled > 0 && size.read + size.assembled <= budget)
    return ReadAheadFit::kReadAndAssemble;
  return ReadAheadFit::kReadOnly;
}

void AssembleNextShards(const DecoderModel& model, ShardPlacement to,
                        const std::vector<KeptBaseWeights::Segment>& current,
                        std::vector<std::vector<KeptBaseWeights::Segment>>& ahead,
                        const std::function<bool()>& cancelled) {
  torch::NoGradGuard no_grad;
  if (to.stage != 3) return;  // every rank holds the whole base: the kept one is taken over
  for (size_t b = 0; b < model.blocks().size() && b < current.size() && b < ahead.size(); ++b) {
    if (cancelled && cancelled()) return;
    int64_t numel = 0;
    const auto [new_lo, new_hi] = FrozenHeld(model.blocks()[b], to, &numel);
    const int64_t slice = (numel + to.world_size - 1) / to.world_size;
    const int64_t lo = to.rank * slice;
    const KeptBaseWeights::Segment& now = current[b];
    torch::Tensor whole = torch::zeros({slice}, now.data.options());
    std::vector<const KeptBaseWeights::Segment*> sources = {&now};
    for (const KeptBaseWeights::Segment& s : ahead[b]) sources.push_back(&s);
    int64_t filled = 0;
    for (const KeptBaseWeights::Segment* s : sources) {
      const int64_t from = std::max(new_lo, s->lo);
      const int64_t until = std::min(new_hi, s->lo + s->data.numel());
      if (from >= until) continue;
      whole.narrow(0, from - lo, until - from).copy_(s->data.narrow(0, from - s->lo, until - from));
      filled += until - from;
    }
    // Held now and read ahead are disjoint; together they must be the whole new range.
    if (filled != new_hi - new_lo) continue;
    ahead[b].clear();
    ahead[b].push_back({lo, std::move(whole)});
  }
}

std::vector<KeptBaseWeights::Segment> ShardedParameters::FrozenShards() const {
  std::vector<KeptBaseWeights::Segment> out;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  for (const auto& block : blocks_) {
    const Flat& flat = block->frozen;
    out.push_back({options_.stage == 3 ? rank * (flat.padded / world) : 0, flat.data.detach()});
  }
  return out;
}

KeptBaseWeights ShardedParameters::ReleaseBaseWeights() {
  (void)StopExchange(/*abort=*/true);
  KeptBaseWeights kept;
  for (KeptBaseWeights::Segment& shard : FrozenShards())
    kept.blocks.push_back({shard.lo, std::move(shard.data), {}});
  for (auto& block : blocks_) block->frozen.data = torch::Tensor();
  blocks_.clear();
  return kept;
}

StatusOr<torch::Tensor> ShardedParameters::GatherFlat(const Flat& flat, torch::ScalarType dtype) {
  if (options_.stage < 3) return flat.data.to(dtype);
  auto full = torch::empty({flat.padded}, flat.data.options().dtype(dtype).requires_grad(false));
  TIDAL_RETURN_IF_ERROR(comm_.AllGather(flat.data.detach().to(dtype), full));
  return full;
}

StatusOr<std::vector<torch::Tensor>> ShardedParameters::BlockParams(
    int64_t b, bool trainable_requires_grad, std::vector<torch::Tensor>& holder,
    torch::Tensor* trainable_full_out) {
  const Block& block = *blocks_[b];
  const BlockSpec& spec = model_.blocks()[b];
  TIDAL_ASSIGN_OR_RETURN(torch::Tensor frozen, GatherFlat(block.frozen, options_.compute_dtype));
  torch::Tensor trainable;
  if (block.trainable.numel > 0 && options_.stage == 3) {
    TIDAL_ASSIGN_OR_RETURN(trainable, GatherFlat(block.trainable, options_.compute_dtype));
    if (trainable_requires_grad) trainable.requires_grad_(true);
  }
  if (trainable_full_out) *trainable_full_out = trainable;
  holder.push_back(frozen);
  holder.push_back(trainable);
  std::vector<torch::Tensor> params(spec.params.size());
  for (const auto* flat : {&block.frozen, &block.trainable}) {
    const bool leaves = flat == &block.trainable && options_.stage < 3;
    const torch::Tensor& full = flat == &block.frozen ? frozen : trainable;
    for (size_t k = 0; k < flat->param_index.size(); ++k) {
      const ParamSpec& p = spec.params[flat->param_index[k]];
      params[flat->param_index[k]] = leaves
                                         ? block.leaves[k].to(options_.compute_dtype)
                                         : full.narrow(0, flat->offset[k], p.numel()).view(p.shape);
    }
  }
  return params;
}

torch::Tensor ShardedParameters::EmbeddingForHead(std::vector<torch::Tensor>& holder) {
  auto params = BlockParams(0, false, holder, nullptr);
  ThrowIfError(params.status());
  return (*params)[0];
}

torch::Tensor ShardedParameters::RunBlock(int64_t b, const torch::Tensor& x) {
  const Block& block = *blocks_[b];
  const bool head_needs_embedding =
      model_.blocks()[b].kind == BlockKind::kHead && model_.head_uses_embedding();
  const bool needs_graph = torch::GradMode::is_enabled() &&
                           ((x.defined() && x.requires_grad()) || block.trainable.numel > 0);
  if (options_.stage == 3 && needs_graph) {
    return GatheredBlockFunction::apply(x.defined() ? x : torch::Tensor(), block.trainable.data,
                                        this, b);
  }
  std::vector<torch::Tensor> holder;
  auto params = BlockParams(b, false, holder, nullptr);
  ThrowIfError(params.status());
  torch::Tensor embedding = head_needs_embedding ? EmbeddingForHead(holder) : torch::Tensor();
  if (options_.stage == 3) {  // nothing here needs a graph: run without one
    torch::NoGradGuard no_grad;
    return model_.ForwardBlock(b, *params, x, ctx_, embedding);
  }
  return model_.ForwardBlock(b, *params, x, ctx_, embedding);
}

StatusOr<torch::Tensor> ShardedParameters::Forward(const ForwardContext& ctx) {
  ctx_ = ctx;
  try {
    torch::Tensor h;
    for (size_t b = 0; b < blocks_.size(); ++b) h = RunBlock(static_cast<int64_t>(b), h);
    return h;
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the trainer's to handle: it may retry the step with a smaller micro-batch
  } catch (const std::exception& e) {
    return Unavailable(std::string("forward: ") + e.what());
  }
}

Status ShardedParameters::AfterMicroBatchBackward() {
  if (options_.stage == 3) return OkStatus();  // backward added to grad_sum already
  torch::NoGradGuard no_grad;
  if (compressing_) {
    // The hooks took this micro-batch's gradient into group_sum; what autograd accumulated in
    // the flat is dropped. A block the hooks did not complete (a leaf without a gradient in
    // this micro-batch) is compressed here.
    for (size_t b = 0; b < blocks_.size(); ++b) {
      if (blocks_[b]->trainable.numel == 0) continue;
      blocks_[b]->grad.zero_();
      if (last_of_group_) CompressBlock(b, group_);
    }
    return OkStatus();
  }
  for (auto& block : blocks_) {
    if (block->trainable.numel == 0) continue;
    auto micro = block->grad.to(torch::kFloat64);
    if (options_.stage == 2) {  // only the slice is accumulated across micro-batches
      auto slice = torch::empty_like(block->grad_sum);
      TIDAL_RETURN_IF_ERROR(comm_.ReduceScatterSum(micro, slice));
      if (comm_.world_size() > 1) traffic_.payload_bytes += micro.numel() * 8;
      block->grad_sum.add_(slice);
    } else {
      block->grad_sum.add_(micro);
    }
    block->grad.zero_();
  }
  return OkStatus();
}

std::vector<TrainableBlockLayout> ShardedParameters::TrainableLayout() const {
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  std::vector<TrainableBlockLayout> out;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Flat& flat = blocks_[b]->trainable;
    if (flat.numel == 0) continue;
    TrainableBlockLayout layout;
    layout.block = static_cast<int64_t>(b);
    layout.key = "block." + std::to_string(b);
    layout.numel = flat.numel;
    layout.padded = flat.padded;
    for (size_t k = 0; k < flat.param_index.size(); ++k) {
      const ParamSpec& p = model_.blocks()[b].params[flat.param_index[k]];
      layout.params.push_back({p.name, p.shape, flat.offset[k], p.numel()});
    }
    const int64_t slice = flat.padded / world;
    layout.owned_lo = rank * slice;
    layout.owned_hi = layout.owned_lo + slice;
    const bool sharded_weights = options_.stage == 3;
    const bool sharded_state = options_.stage >= 1 && world > 1;
    layout.held_lo = sharded_weights ? layout.owned_lo : 0;
    layout.held_hi = sharded_weights ? layout.owned_hi : flat.padded;
    layout.optimizer_lo = sharded_state ? layout.owned_lo : 0;
    layout.optimizer_hi = sharded_state ? layout.owned_hi : flat.padded;
    out.push_back(std::move(layout));
  }
  return out;
}

StatusOr<torch::Tensor> ShardedParameters::TrainableRange(int64_t block, int64_t lo,
                                                          int64_t hi) const {
  for (const TrainableBlockLayout& l : TrainableLayout()) {
    if (l.block != block) continue;
    if (lo < l.held_lo || hi > l.held_hi || lo > hi)
      return InvalidArgument("block " + std::to_string(block) + ": elements [" +
                             std::to_string(lo) + ", " + std::to_string(hi) +
                             ") are not held by this rank");
    torch::NoGradGuard no_grad;
    return blocks_[block]
        ->trainable.data.detach()
        .narrow(0, lo - l.held_lo, hi - lo)
        .to(torch::kCPU, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  }
  return NotFound("block " + std::to_string(block) + " has no trainable weights");
}

Status ShardedParameters::SetTrainableHeld(int64_t block, const torch::Tensor& values) {
  for (const TrainableBlockLayout& l : TrainableLayout()) {
    if (l.block != block) continue;
    if (values.numel() != l.held_hi - l.held_lo)
      return InvalidArgument("block " + std::to_string(block) + ": " +
                             std::to_string(values.numel()) + " values for " +
                             std::to_string(l.held_hi - l.held_lo) + " held elements");
    torch::NoGradGuard no_grad;
    blocks_[block]->trainable.data.copy_(values.reshape({-1}));
    return OkStatus();
  }
  return NotFound("block " + std::to_string(block) + " has no trainable weights");
}

StatusOr<std::vector<TrainableSlice>> ShardedParameters::ReduceGradients() {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  if (compressing_) {  // the exchanges still in flight finish; they filled grad_sum
    const auto start = std::chrono::steady_clock::now();
    for (size_t b = 0; b < blocks_.size(); ++b)
      if (blocks_[b]->trainable.numel > 0 && blocks_[b]->compressed_group < local_groups() - 1)
        return Internal("gradient compression: block " + std::to_string(b) +
                        " reached the step's reduction with groups left uncompressed");
    TIDAL_RETURN_IF_ERROR(StopExchange(/*abort=*/false));
    traffic_.exchange_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::vector<TrainableSlice> slices;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Flat& flat = blocks_[b]->trainable;
    if (flat.numel == 0) continue;
    torch::Tensor param = flat.data.detach();
    torch::Tensor sum = blocks_[b]->grad_sum;  // fp64
    if (world > 1 && compressing_) {
      const int64_t slice = flat.padded / world;
      if (options_.stage == 1) sum = sum.narrow(0, rank * slice, slice);
      if (options_.stage >= 1) param = param.narrow(0, rank * slice, slice);
    } else if (world > 1) {
      const int64_t slice = flat.padded / world;
      switch (options_.stage) {
        case 0:
          TIDAL_RETURN_IF_ERROR(comm_.AllReduceSum(sum));
          traffic_.payload_bytes += sum.numel() * 8;
          break;
        case 1: {
          auto reduced = torch::empty({slice}, sum.options());
          TIDAL_RETURN_IF_ERROR(comm_.ReduceScatterSum(sum, reduced));
          traffic_.payload_bytes += sum.numel() * 8;
          sum = reduced;
          param = param.narrow(0, rank * slice, slice);
          break;
        }
        case 2:
          param = param.narrow(0, rank * slice, slice);
          break;
        default:  // 3: data and grad_sum are already this rank's slice
          break;
      }
    }
    // Rounded to fp32 once, here: the optimizer's gradient.
    slices.push_back({"block." + std::to_string(b), param, sum.to(torch::kFloat32)});
  }
  return slices;
}

void ShardedParameters::DiscardGradients() {
  torch::NoGradGuard no_grad;
  (void)StopExchange(/*abort=*/true);  // nothing was exchanged: the caller agreed before
  compressing_ = false;
  for (auto& block : blocks_) {
    if (block->trainable.numel == 0) continue;
    if (block->group_sum.defined()) block->group_sum.zero_();
    for (torch::Tensor& r : block->next_residual) r = torch::Tensor();
    if (block->grad.defined()) block->grad.zero_();
    if (options_.stage == 3) block->trainable.data.mutable_grad() = torch::Tensor();
    block->grad_sum.zero_();
  }
}

Status ShardedParameters::FinishStep(bool keep_residuals) {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  for (auto& block : blocks_) {
    Flat& flat = block->trainable;
    if (flat.numel == 0) continue;
    if (compressing_) {
      if (keep_residuals) block->residual.swap(block->next_residual);
      for (torch::Tensor& r : block->next_residual) r = torch::Tensor();
      block->message = torch::Tensor();
      for (SparseGradient& sent : block->sent) sent = {};
    }
    if (world > 1 && (options_.stage == 1 || options_.stage == 2)) {
      auto full = flat.data.detach();
      const int64_t slice = flat.padded / world;
      TIDAL_RETURN_IF_ERROR(comm_.AllGather(full.narrow(0, rank * slice, slice).clone(), full));
    }
    if (block->grad.defined()) block->grad.zero_();
    if (options_.stage == 3) flat.data.mutable_grad() = torch::Tensor();
    block->grad_sum.zero_();
  }
  compressing_ = false;
  return OkStatus();
}

StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> ShardedParameters::Gather(
    bool trainable_only) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const BlockSpec& spec = model_.blocks()[b];
    for (const Flat* flat : {&blocks_[b]->frozen, &blocks_[b]->trainable}) {
      if (flat->numel == 0 || (trainable_only && flat == &blocks_[b]->frozen)) continue;
      TIDAL_ASSIGN_OR_RETURN(torch::Tensor full, GatherFlat(*flat, flat->data.scalar_type()));
      for (size_t k = 0; k < flat->param_index.size(); ++k) {
        const ParamSpec& p = spec.params[flat->param_index[k]];
        named.emplace_back(p.name, full.narrow(0, flat->offset[k], p.numel()).view(p.shape));
      }
    }
  }
  return named;
}

int64_t ShardedParameters::ResidentParameterBytes() const {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& block : blocks_) {
    for (const Flat* flat : {&block->frozen, &block->trainable}) {
      const auto& storage = flat->data.storage();
      if (seen.insert(storage.unsafeGetStorageImpl()).second)
        bytes += static_cast<int64_t>(storage.nbytes());
    }
  }
  return bytes;
}

namespace {
int64_t BlockBytes(int64_t frozen, int64_t trainable, torch::ScalarType compute) {
  return frozen * static_cast<int64_t>(c10::elementSize(compute)) + trainable * 4;
}
}  // namespace

int64_t ShardedParameters::TotalParameterBytes() const {
  int64_t total = 0;
  for (const auto& block : blocks_)
    total += BlockBytes(block->frozen.numel, block->trainable.numel, options_.compute_dtype);
  return total;
}

int64_t ShardedParameters::LargestBlockBytes() const {
  int64_t largest = 0;
  for (const auto& block : blocks_)
    largest = std::max(
        largest, BlockBytes(block->frozen.numel, block->trainable.numel, options_.compute_dtype));
  return largest;
}

int64_t ShardedParameters::TrainableParameterCount() const {
  int64_t n = 0;
  for (const auto& block : blocks_) n += block->trainable.numel;
  return n;
}

uint64_t ShardedParameters::FrozenChecksum() const {
  uint64_t hash = 0;
  for (const auto& block : blocks_) {
    auto bytes = block->frozen.data.detach().cpu().contiguous();
    const auto* p = static_cast<const uint8_t*>(bytes.data_ptr());
    const size_t n = bytes.numel() * bytes.element_size();
    uint64_t word = 0;
    for (size_t i = 0; i < n; ++i) {
      word = (word << 8) | p[i];
      if (i % 8 == 7 || i + 1 == n) hash = MixSeed(hash, word), word = 0;
    }
  }
  return hash;
}

}  // namespace tidal::engine
