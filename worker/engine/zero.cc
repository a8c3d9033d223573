// worker/engine/zero.cc — ShardedParameters: the parameters sharded by ZeRO stage, a step's
// forward (stage 3 gathering each block), its gradients reduced into the shards, the update's
// hand-off and the gathered copies. Compression: compression_hook.cc; loading: zero_load.cc.
#include "worker/engine/zero.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "worker/engine/zero_internal.h"

namespace tidal::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
    blocks_.push_back(std::move(block));
  }
  if (options_.compression_groups > 0 && !sharded) {
    std::vector<GradientCompressionHook::Bucketed> flats;
    for (const auto& block : blocks_)
      flats.push_back({block->trainable.offset, block->trainable.numel, block->trainable.padded,
                       block->grad_sum});
    compression_ = std::make_unique<GradientCompressionHook>(
        comm_,
        GradientCompressionHook::Options{options_.stage, options_.compression_groups,
                                         options_.compression_ratio},
        std::move(flats), &traffic_);
    GradientCompressionHook* hook = compression_.get();
    for (size_t b = 0; b < blocks_.size(); ++b)
      for (size_t k = 0; k < blocks_[b]->leaves.size(); ++k)
        blocks_[b]->leaves[k].register_hook([hook, b, k](const torch::Tensor& grad) {
          hook->OnLeafGradient(b, k, grad);
          return torch::Tensor();  // autograd's own accumulation goes on, and is dropped
        });
  }
}

ShardedParameters::~ShardedParameters() = default;

void ShardedParameters::BeginStep(bool compress, double loss_scale, bool overlap) {
  traffic_ = {};
  if (compression_) compression_->BeginStep(compress, loss_scale, overlap);
}

StatusOr<torch::Tensor> ShardedParameters::Residual(int64_t block, int64_t group) const {
  if (!compression_)
    return NotFound("block " + std::to_string(block) + " has no compression residual");
  return compression_->Residual(block, group);
}

Status ShardedParameters::SetResidual(int64_t block, int64_t group, const torch::Tensor& values) {
  if (!compression_)
    return NotFound("block " + std::to_string(block) + " has no compression residual");
  return compression_->SetResidual(block, group, values);
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
  if (compressing()) {
    // The hook took this micro-batch's gradient; what autograd accumulated in the flat is
    // dropped.
    for (auto& block : blocks_)
      if (block->trainable.numel > 0) block->grad.zero_();
    compression_->AfterMicroBatch();
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
  const bool compressed = compressing();
  // The exchanges still in flight finish; they filled grad_sum.
  if (compressed) TIDAL_RETURN_IF_ERROR(compression_->AwaitExchanges());
  std::vector<TrainableSlice> slices;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Flat& flat = blocks_[b]->trainable;
    if (flat.numel == 0) continue;
    torch::Tensor param = flat.data.detach();
    torch::Tensor sum = blocks_[b]->grad_sum;  // fp64
    if (world > 1 && compressed) {
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
  if (compression_) compression_->Discard();
  for (auto& block : blocks_) {
    if (block->trainable.numel == 0) continue;
    if (block->grad.defined()) block->grad.zero_();
    if (options_.stage == 3) block->trainable.data.mutable_grad() = torch::Tensor();
    block->grad_sum.zero_();
  }
}

Status ShardedParameters::FinishStep(bool keep_residuals) {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  if (compression_) compression_->EndStep(keep_residuals);
  for (auto& block : blocks_) {
    Flat& flat = block->trainable;
    if (flat.numel == 0) continue;
    if (world > 1 && (options_.stage == 1 || options_.stage == 2)) {
      auto full = flat.data.detach();
      const int64_t slice = flat.padded / world;
      TIDAL_RETURN_IF_ERROR(comm_.AllGather(full.narrow(0, rank * slice, slice).clone(), full));
    }
    if (block->grad.defined()) block->grad.zero_();
    if (options_.stage == 3) flat.data.mutable_grad() = torch::Tensor();
    block->grad_sum.zero_();
  }
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
