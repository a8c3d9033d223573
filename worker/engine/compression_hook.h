// worker/engine/compression_hook.h — gradient compression as a communication hook of
// ShardedParameters (stages 0-2), the way DDP's comm hooks replace its all-reduce: the
// parameters hand each trainable leaf's gradient to the hook, and the hook fills each block's
// step gradient with what every rank's compression groups sent. Top-k with error feedback
// (compression.h): per group and block a residual, a selection once the group's last
// micro-batch has reached the block, one packed message per block, all-gathered on a thread of
// the hook's own while backward goes on through the blocks below.
//
// A step with the hook: BeginStep (whether it compresses: a dense warm-up step does not, and
// the parameters reduce as they would without a hook), then per micro-batch SetMicroBatchGroup
// before its backward and AfterMicroBatch after it, then AwaitExchanges at the reduction, then
// EndStep (or Discard for a step given up before its reduction). The result is Σ over all groups
// of what each sent: the same at every world size dividing the groups.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "worker/engine/comm.h"
#include "worker/engine/compression.h"

namespace tidal::engine {

// A step's gradient traffic: the bytes this rank handed to gradient collectives (dense or
// compressed), the time spent selecting, and the time the reduction waited for the exchanges
// still in flight (the part of them backward did not hide).
struct GradientTraffic {
  int64_t payload_bytes = 0;
  double compress_seconds = 0;
  double exchange_wait_seconds = 0;
};

class GradientCompressionHook {
 public:
  // One block's trainable flat as the hook sees it. `param_offsets` is where each parameter
  // (each a bucket of its own: LoRA A and B gradients differ by orders of magnitude) starts in
  // the flat of `numel` elements, padded to `padded`; `grad_sum` is the block's fp64 step
  // gradient the exchange writes ([padded], or this rank's [padded / W] at stage 2). A block
  // without trainable weights has numel 0.
  struct Bucketed {
    std::vector<int64_t> param_offsets;
    int64_t numel = 0;
    int64_t padded = 0;
    torch::Tensor grad_sum;
  };
  struct Options {
    int stage = 0;       // 0-2
    int64_t groups = 0;  // the job's compression groups, a multiple of the world size
    double ratio = 1.0;  // the share of each parameter's entries a group sends
  };
  // Throws std::invalid_argument for a block whose indices int32 cannot address (over 2^31
  // trainable elements). `traffic` (the parameters') outlives the hook.
  GradientCompressionHook(Comm& comm, Options options, std::vector<Bucketed> blocks,
                          GradientTraffic* traffic);
  ~GradientCompressionHook();  // an exchange in flight is stopped
  GradientCompressionHook(const GradientCompressionHook&) = delete;
  GradientCompressionHook& operator=(const GradientCompressionHook&) = delete;

  // This rank's groups are [first_group(), first_group() + local_groups()) of groups().
  int64_t groups() const { return options_.groups; }
  int64_t local_groups() const { return options_.groups / comm_.world_size(); }
  int64_t first_group() const { return comm_.rank() * local_groups(); }

  // Before a step's first micro-batch: whether it compresses, the loss scale its gradients carry
  // (residuals and messages are kept unscaled), and whether a block's exchange may start as soon
  // as its message is packed (`overlap`); false: not before AwaitExchanges (the caller runs
  // collectives of its own between micro-batches).
  void BeginStep(bool compress, double loss_scale, bool overlap);
  bool active() const { return active_; }
  // Before a micro-batch's backward: its group among this rank's, and whether it is the
  // group's last.
  void SetMicroBatchGroup(int64_t group, bool last);
  // From the gradient hook of block b's trainable leaf k, on the thread running backward: into
  // the group's fp64 sum; in the group's last micro-batch a block whose leaves have all arrived
  // is selected at once.
  void OnLeafGradient(size_t b, size_t k, const torch::Tensor& grad);
  // After a micro-batch's backward: a block the hooks did not complete (a leaf without a
  // gradient in this micro-batch) is selected here.
  void AfterMicroBatch();
  // At the step's reduction: waits for the exchanges in flight; every block's grad_sum is then
  // the step's gradient. An error when a block still has groups to select, or a collective failed.
  Status AwaitExchanges();
  // The step's end: each group's residual becomes the one it left (`keep_residuals` false, a
  // step whose update was skipped: the one it started with).
  void EndStep(bool keep_residuals);
  // A step given up before its reduction: nothing was exchanged, the residuals are unchanged.
  void Discard();

  // Block b's residual of group g (fp32, the trainable flat's numel elements), for checkpoints.
  StatusOr<torch::Tensor> Residual(int64_t block, int64_t group) const;
  Status SetResidual(int64_t block, int64_t group, const torch::Tensor& values);
  void ClearResiduals();  // a resume from a checkpoint without them

 private:
  struct Block;
  void Select(size_t b, int64_t group);
  void ExchangeLoop();
  Status ExchangeBlock(size_t b);
  Status StopExchange(bool abort);
  StatusOr<Block*> Find(int64_t block, int64_t group) const;

  Comm& comm_;
  const Options options_;
  std::vector<std::unique_ptr<Block>> blocks_;
  GradientTraffic* traffic_;
  // The step in flight.
  bool active_ = false;
  bool overlap_ = false;
  double scale_ = 1.0;
  int64_t group_ = 0;
  bool last_of_group_ = false;
  // The exchange thread: all-gathers each block's message once it is packed, in descending
  // block order (the order backward completes them, and the same on every rank).
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> ready_;  // per block: its message is packed
  bool open_ = false;        // exchanges may start
  bool abort_ = false;
  Status exchange_status_;
  std::thread exchange_;
};

}  // namespace tidal::engine
