// worker/engine/compression_hook.cc — GradientCompressionHook: each block's local gradient
// summed per group from the leaves' hooks and selected with its residual, and the thread that
// all-gathers the packed messages into the blocks' step gradients.
#include "worker/engine/compression_hook.h"

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

namespace tidal::engine {

// Per block: the local gradient of the group in flight, summed in fp64 over its micro-batches
// straight from the leaves' gradient hooks ([padded], scaled as the loss is); per group of this
// rank, the residual (fp32 [numel], unscaled), the one this step leaves (committed by EndStep)
// and what the group sends; the packed message of every group; the entries a group sends; the
// last group selected in this step (-1: none) and the leaves whose gradient arrived in the
// micro-batch under way.
struct GradientCompressionHook::Block {
  Bucketed flat;
  torch::Tensor group_sum;
  std::vector<torch::Tensor> residual, next_residual;
  std::vector<SparseGradient> sent;
  torch::Tensor message;
  int64_t k = 0;
  int64_t selected_group = -1;
  size_t arrived = 0;
};

GradientCompressionHook::GradientCompressionHook(Comm& comm, Options options,
                                                 std::vector<Bucketed> blocks,
                                                 GradientTraffic* traffic)
    : comm_(comm), options_(options), traffic_(traffic) {
  for (size_t b = 0; b < blocks.size(); ++b) {
    auto block = std::make_unique<Block>();
    block->flat = std::move(blocks[b]);
    const Bucketed& flat = block->flat;
    if (flat.numel > 0) {
      if (flat.numel > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("gradient compression: block " + std::to_string(b) + " has " +
                                    std::to_string(flat.numel) +
                                    " trainable elements, more than the 2^31 its indices address");
      block->group_sum = torch::zeros({flat.padded}, flat.grad_sum.options());
      for (int64_t g = 0; g < local_groups(); ++g)
        block->residual.push_back(
            torch::zeros({flat.numel}, flat.grad_sum.options().dtype(torch::kFloat32)));
      block->next_residual.resize(block->residual.size());
      block->sent.resize(block->residual.size());
      for (size_t p = 0; p < flat.param_offsets.size(); ++p) {
        const int64_t end =
            p + 1 < flat.param_offsets.size() ? flat.param_offsets[p + 1] : flat.numel;
        block->k += TopKCount(end - flat.param_offsets[p], options_.ratio);
      }
    }
    blocks_.push_back(std::move(block));
  }
}

GradientCompressionHook::~GradientCompressionHook() { (void)StopExchange(/*abort=*/true); }

void GradientCompressionHook::BeginStep(bool compress, double loss_scale, bool overlap) {
  (void)StopExchange(/*abort=*/true);  // a step given up before its reduction
  active_ = compress;
  overlap_ = overlap;
  scale_ = loss_scale;
  group_ = 0;
  last_of_group_ = false;
  if (!active_) return;
  for (auto& block : blocks_) {
    block->selected_group = -1;
    block->arrived = 0;
    if (block->group_sum.defined()) block->group_sum.zero_();
  }
  std::lock_guard<std::mutex> lock(mu_);
  ready_.assign(blocks_.size(), 0);
  open_ = overlap;
  abort_ = false;
  exchange_status_ = OkStatus();
  exchange_ = std::thread([this] { ExchangeLoop(); });
}

void GradientCompressionHook::SetMicroBatchGroup(int64_t group, bool last) {
  group_ = group;
  last_of_group_ = last;
  for (auto& block : blocks_) block->arrived = 0;
}

void GradientCompressionHook::OnLeafGradient(size_t b, size_t k, const torch::Tensor& grad) {
  if (!active_) return;
  torch::NoGradGuard no_grad;
  Block& block = *blocks_[b];
  block.group_sum.narrow(0, block.flat.param_offsets[k], grad.numel())
      .add_(grad.reshape({-1}).to(torch::kFloat64));
  if (last_of_group_ && ++block.arrived == block.flat.param_offsets.size()) Select(b, group_);
}

void GradientCompressionHook::AfterMicroBatch() {
  if (!active_ || !last_of_group_) return;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b]->flat.numel > 0) Select(b, group_);
}

void GradientCompressionHook::Select(size_t b, int64_t group) {
  Block& block = *blocks_[b];
  if (block.selected_group >= group) return;  // done in its hook
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const Bucketed& flat = block.flat;
  torch::Tensor local = block.group_sum.narrow(0, 0, flat.numel);
  if (scale_ != 1.0) local = local / scale_;  // a power of two: exact
  std::vector<torch::Tensor> indices, values, rest;
  for (size_t p = 0; p < flat.param_offsets.size(); ++p) {
    const int64_t at = flat.param_offsets[p];
    const int64_t n =
        (p + 1 < flat.param_offsets.size() ? flat.param_offsets[p + 1] : flat.numel) - at;
    torch::Tensor next;
    SparseGradient part =
        TopKWithFeedback(local.narrow(0, at, n), block.residual[group].narrow(0, at, n),
                         TopKCount(n, options_.ratio), &next);
    indices.push_back(part.indices + at);
    values.push_back(part.values);
    rest.push_back(next);
  }
  block.sent[group] = {torch::cat(indices), torch::cat(values)};
  block.next_residual[group] = torch::cat(rest);
  block.group_sum.zero_();
  block.selected_group = group;
  if (group == local_groups() - 1) {
    block.message = PackSparse(block.sent).to(comm_.device());
    std::lock_guard<std::mutex> lock(mu_);
    ready_[b] = 1;
    cv_.notify_all();
  }
  traffic_->compress_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientCompressionHook::ExchangeLoop() {
  torch::NoGradGuard no_grad;
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (blocks_[i]->flat.numel == 0) continue;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return abort_ || (open_ && ready_[i]); });
      if (abort_) return;
    }
    Status status;
    try {
      status = ExchangeBlock(i);
    } catch (const std::exception& e) {
      status = Unavailable(std::string("gradient exchange: ") + e.what());
    }
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      exchange_status_ = status;
      return;
    }
  }
}

// Every rank's messages for block b, gathered in rank order (= group order), summed in fp64
// into the step's gradient: the whole flat at stages 0-1, this rank's slice at stage 2.
Status GradientCompressionHook::ExchangeBlock(size_t b) {
  Block& block = *blocks_[b];
  const Bucketed& flat = block.flat;
  const int64_t world = comm_.world_size();
  auto gathered = torch::empty({block.message.numel() * world}, block.message.options());
  TIDAL_RETURN_IF_ERROR(comm_.AllGather(block.message, gathered));
  auto dense = torch::zeros({flat.padded}, flat.grad_sum.options());
  AddPackedInto(gathered, block.k, dense);
  if (scale_ != 1.0) dense.mul_(scale_);
  if (options_.stage == 2)
    flat.grad_sum.copy_(dense.narrow(0, comm_.rank() * (flat.padded / world), flat.padded / world));
  else
    flat.grad_sum.copy_(dense);
  if (world > 1) traffic_->payload_bytes += block.message.numel() * 4;
  return OkStatus();
}

Status GradientCompressionHook::StopExchange(bool abort) {
  if (!exchange_.joinable()) return OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort) abort_ = true;
    open_ = true;
    cv_.notify_all();
  }
  exchange_.join();
  std::lock_guard<std::mutex> lock(mu_);
  Status status = exchange_status_;
  exchange_status_ = OkStatus();
  return status;
}

Status GradientCompressionHook::AwaitExchanges() {
  const auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b]->flat.numel > 0 && blocks_[b]->selected_group < local_groups() - 1)
      return Internal("gradient compression: block " + std::to_string(b) +
                      " reached the step's reduction with groups left uncompressed");
  TIDAL_RETURN_IF_ERROR(StopExchange(/*abort=*/false));
  traffic_->exchange_wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return OkStatus();
}

void GradientCompressionHook::EndStep(bool keep_residuals) {
  if (!active_) return;
  for (auto& block : blocks_) {
    if (keep_residuals) block->residual.swap(block->next_residual);
    for (torch::Tensor& r : block->next_residual) r = torch::Tensor();
    block->message = torch::Tensor();
    for (SparseGradient& sent : block->sent) sent = {};
  }
  active_ = false;
}

void GradientCompressionHook::Discard() {
  (void)StopExchange(/*abort=*/true);  // nothing was exchanged: the caller agreed before
  torch::NoGradGuard no_grad;
  for (auto& block : blocks_) {
    if (block->group_sum.defined()) block->group_sum.zero_();
    for (torch::Tensor& r : block->next_residual) r = torch::Tensor();
  }
  active_ = false;
}

StatusOr<GradientCompressionHook::Block*> GradientCompressionHook::Find(int64_t block,
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

StatusOr<torch::Tensor> GradientCompressionHook::Residual(int64_t block, int64_t group) const {
  TIDAL_ASSIGN_OR_RETURN(Block * b, Find(block, group));
  return b->residual[group - first_group()].to(torch::kCPU, torch::kFloat32, false, true);
}

void GradientCompressionHook::ClearResiduals() {
  torch::NoGradGuard no_grad;
  for (auto& block : blocks_)
    for (torch::Tensor& r : block->residual) r.zero_();
}

Status GradientCompressionHook::SetResidual(int64_t block, int64_t group,
                                            const torch::Tensor& values) {
  TIDAL_ASSIGN_OR_RETURN(Block * b, Find(block, group));
  torch::Tensor& r = b->residual[group - first_group()];
  if (values.numel() != r.numel())
    return InvalidArgument("block " + std::to_string(block) + ": a residual of " +
                           std::to_string(values.numel()) + " elements for " +
                           std::to_string(r.numel()));
  torch::NoGradGuard no_grad;
  r.copy_(values.reshape({-1}));
  return OkStatus();
}

}  // namespace tidal::engine
