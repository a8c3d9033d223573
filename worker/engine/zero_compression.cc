// worker/engine/zero_compression.cc — ShardedParameters' gradient compression (stages 0-2): the
// step's groups, each block's local gradient summed per group from the leaves' hooks and
// compressed with its residual, and the thread that all-gathers the packed messages.
#include <algorithm>
#include <chrono>

#include "worker/engine/zero_internal.h"

namespace tidal::engine {

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

}  // namespace tidal::engine
