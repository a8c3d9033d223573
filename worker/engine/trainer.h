// worker/engine/trainer.h — the training loop, one page: for each optimizer step, run the
// rank's micro-batches (gradient accumulation = global / (micro × W)), reduce gradients, clip,
// step the LR schedule and AdamW, and report loss, grad norm, lr and tokens/s.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "api/train_config.h"
#include "common/status.h"
#include "worker/engine/auto_micro_batch.h"
#include "worker/engine/comm.h"
#include "worker/engine/data.h"
#include "worker/engine/lr_schedule.h"
#include "worker/engine/memory_meter.h"
#include "worker/engine/model.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/step_record.h"
#include "worker/engine/zero.h"

namespace tidal::engine {

struct TrainerOptions {
  std::optional<int64_t> max_steps;
  torch::Device device = torch::kCPU;
  // The rows to train on (a token store through the prefetching loader); required.
  std::unique_ptr<RowSource> data;
  // spec.model.uri's files (a local directory, or an object store prefix read by range); when
  // unset, the uri is a local directory.
  std::unique_ptr<ModelFiles> model_files;
  // The most host memory a read ahead (ReadAhead) may hold; -1: no cap of its own. Either way
  // it holds at most what the pod's memory cgroup leaves and half of what the host leaves
  // (ReadMemoryHeadroom).
  int64_t read_ahead_max_bytes = -1;
};

class HfCheckpoint;

class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                   std::unique_ptr<Comm> comm,
                                                   TrainerOptions options);
  ~Trainer();

  // The engine across generations: LeaveGroup ends this generation's process group and keeps
  // the model, the data and this rank's base weights; JoinGroup shards the parameters for the
  // next group, copying what this rank kept and reading only the rest from spec.model (or the
  // seeded initialisation), and starts from the state Create starts from — step 0, no
  // optimizer state, initial adapters — for the resume to overwrite. Between the two the
  // trainer has no group and must not step. A JoinGroup that fails leaves it unusable.
  void LeaveGroup();
  Status JoinGroup(std::unique_ptr<Comm> comm);
  // While this generation trains, on another thread than the training one: reads the base
  // weights this rank will hold as `rank` of `world_size` and does not hold now
  // (ReadAheadBaseWeights), kept for the next JoinGroup, which then copies instead of reading.
  // The caller sees that it has returned before LeaveGroup. Stops when `cancelled` says so,
  // keeping what it read; `complete` (may be null) says whether that was everything.
  Status ReadAhead(int rank, int world_size, const std::function<bool()>& cancelled,
                   bool* complete);

  // One optimizer step over the next global batch. Under microBatchSize auto, in micro-batches
  // of the size chosen so far (auto_micro_batch()): grown by ×1.2 after a step whose peak
  // memory, scaled to the larger size, stays under spec.optimization.memoryTargetPercent of the
  // device's (MemoryMeter); cut after a step over it; and after an out-of-memory every rank
  // agrees on (ZeRO 0-2, or one rank), the step's gradients are dropped and it runs again
  // smaller, no larger size being tried again. The loss and the gradient are those of
  // micro-batch 1 (each row the dropout masks and loss weight it has alone), so the curve does
  // not depend on the sizes chosen.
  StatusOr<StepRecord> Step();
  const AutoMicroBatch& auto_micro_batch() const { return auto_micro_; }
  int64_t step() const { return step_; }
  int64_t max_steps() const { return max_steps_; }

  const DecoderModel& model() const { return *model_; }
  ShardedParameters& parameters() { return *params_; }
  Comm& comm() { return *comm_; }
  const ShardedAdamW& optimizer() const { return optimizer_; }
  ShardedAdamW& optimizer() { return optimizer_; }
  const TrainConfig& config() const { return config_; }
  const RowSource& data() const { return *data_; }

  // What evolves besides weights and optimizer moments, for checkpoints: the step (which
  // also fixes the data cursor and dropout masks: both are functions of seed and step), the
  // LR schedule with its adaptive-warmup window, and the fp16 loss scale.
  nlohmann::json StateJson() const;
  // Refuses a state from another run shape, naming the field.
  Status RestoreState(const nlohmann::json& state);
  const LrSchedule& schedule() const { return schedule_; }
  // Wall time of the steps trained so far, over every generation (kept in checkpoints): the
  // exposure the automatic checkpoint interval estimates the failure rate over.
  double trained_seconds() const { return trained_seconds_; }
  // State other parts of the worker keep in the checkpoint beside the trainer's own (the
  // checkpoint hooks' measured cost), an object saved with StateJson and restored with it.
  nlohmann::json& extensions() { return extensions_; }
  int64_t gradient_accumulation() const { return accumulation_; }

 private:
  Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm, TrainerOptions options);
  Status Initialize();
  // The part of a start that depends on the group: gradient accumulation, the initial state,
  // the parameters sharded for it (from `kept` where it holds them).
  Status StartGeneration(KeptBaseWeights* kept);
  OptimizationSpec ScheduleSpec() const;
  // One attempt at the step in physical micro-batches of `micro` rows; `per_row` (auto): the
  // loss and masks of micro-batch 1. An out-of-memory all ranks agree on sets *out_of_memory
  // and returns with the step's gradients dropped and nothing else changed.
  StatusOr<StepRecord> RunStep(int64_t micro, bool per_row, bool* out_of_memory = nullptr);
  // The parts of RunStep, in the order it calls them.
  struct Pass {  // one forward and backward over `rows` of this rank's rows of the step
    int64_t first_row, rows, group;
    bool last_of_group;  // of its compression group (the group's exchange may start after it)
  };
  struct StepTally {  // what the passes of one attempt accumulate
    int64_t micro = 1;
    bool per_row = false, compress = false, agree_out_of_memory = false, moe = false;
    std::vector<uint64_t> ahead;  // the rows read ahead from the step's first
    torch::Tensor loss, tokens;   // fp64 on the device: no host sync per micro-batch
    double data_wait = 0;
    double step_tokens = 0;       // every rank's, once reduced
    int64_t base_bytes = 0;       // in use when the step began (the memory meter's)
    MoeRecord routed;             // what each MoE layer routed in the last pass
    torch::Tensor expert_tokens;  // [MoE layers, experts] int64, summed over the passes
  };
  std::vector<Pass> PlanPasses(int64_t micro, int64_t groups) const;
  std::vector<uint64_t> RowsAhead() const;
  // An out-of-memory inside the pass goes to *failure; other errors are returned.
  Status RunPass(const Pass& pass, bool first, StepTally& tally, std::string* failure);
  Status SettleOutOfMemory(StepTally& tally, std::string* failure);
  StatusOr<StepRecord> ReduceStepFigures(StepTally& tally,
                                         const std::vector<TrainableSlice>& slices);
  void ApplyUpdate(StepRecord& record, std::vector<TrainableSlice>& slices);
  int64_t AutoMicroBatchRows() const;  // the rows a pass may hold: per rank (per group)
  Status AgreeAutoMicroBatch();

  TrainConfig config_;
  std::unique_ptr<Comm> comm_;
  TrainerOptions options_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<HfCheckpoint> hf_;  // spec.model.uri's files, kept open for later generations
  torch::ScalarType dtype_ = torch::kFloat32;
  std::unique_ptr<ShardedParameters> params_;
  KeptBaseWeights kept_;  // between LeaveGroup and JoinGroup
  // ReadAhead's segments, per block, until LeaveGroup hands them to kept_.
  std::vector<std::vector<KeptBaseWeights::Segment>> ahead_;
  // Free what a change of generation no longer needs while the next one starts: the old gloo
  // process group (LeaveGroup) and the base weights a JoinGroup's Load retired
  // (KeptBaseWeights::retired). Joined by the next LeaveGroup and by the destructor.
  std::vector<std::thread> retiring_;
  void JoinRetired();
  std::unique_ptr<RowSource> data_;
  // Sequences of the run this rank reads at `step` (micro-batches in order).
  std::vector<uint64_t> RankSequences(int64_t step) const;
  Status WarmData();
  std::string DataKey() const;
  bool warmed_ = false;
  ShardedAdamW optimizer_;
  LrSchedule schedule_;
  torch::Tensor rope_cos_, rope_sin_;
  int64_t step_ = 0;
  int64_t max_steps_ = 0;
  int64_t accumulation_ = 1;
  double loss_scale_ = 1.0;  // fp16 only
  int64_t good_steps_ = 0;
  double trained_seconds_ = 0;
  nlohmann::json extensions_ = nlohmann::json::object();
  // microBatchSize auto.
  AutoMicroBatch auto_micro_;
  std::unique_ptr<MemoryMeter> meter_;
  MemoryMeterOptions meter_options_;
  bool oom_injected_ = false;  // TIDAL_TEST_OOM_AT_STEP fires once per process
  bool auto_agreed_ = false;   // AgreeAutoMicroBatch ran in this generation
};

}  // namespace tidal::engine
