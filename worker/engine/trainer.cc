// worker/engine/trainer.cc
#include "worker/engine/trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>

#include "common/log.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/process_memory.h"

namespace tidal::engine {

namespace {

StatusOr<torch::ScalarType> ComputeDtype(const std::string& precision, torch::Device device) {
  if (precision == "fp32") return torch::kFloat32;
  if (precision == "bf16") return torch::kBFloat16;
  if (device.is_cpu())
    return InvalidArgument(
        "spec.optimization.precision: fp16 needs a CUDA device; use fp32 or "
        "bf16 on CPU");
  return torch::kFloat16;
}

// fp16 dynamic loss scaling, as DeepSpeed/apex: start high, halve on overflow, double after
// this many clean steps.
constexpr double kInitialLossScale = 65536.0;
constexpr int64_t kLossScaleWindow = 1000;
// microBatchSize auto grows by this factor (at least one row) per step that leaves room.

// Below the least micro-batch size this process ran out of memory at (0: never), for every
// trainer it builds: a generation that failed on it (ZeRO-3, several ranks) may be followed by
// a new engine, and none may try that size again.
std::atomic<int64_t>& ProcessOutOfMemoryCap() {
  static std::atomic<int64_t> cap{0};
  return cap;
}
void LowerProcessOutOfMemoryCap(int64_t cap) {
  auto& c = ProcessOutOfMemoryCap();
  for (int64_t now = c.load(); (now == 0 || cap < now) && !c.compare_exchange_weak(now, cap);) {
  }
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm, TrainerOptions options)
    : config_(config),
      comm_(std::move(comm)),
      options_(std::move(options)),
      optimizer_(AdamWOptions{config.optimization.beta1, config.optimization.beta2,
                              config.optimization.eps, config.optimization.weight_decay,
                              config.optimization.offload_optimizer == "cpu"}),
      schedule_(ScheduleSpec()) {}

OptimizationSpec Trainer::ScheduleSpec() const {
  OptimizationSpec spec = config_.optimization;
  if (options_.max_steps) spec.max_steps = *options_.max_steps;
  return spec;
}

Trainer::~Trainer() { JoinRetired(); }

void Trainer::JoinRetired() {
  for (std::thread& t : retiring_) t.join();
  retiring_.clear();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                   std::unique_ptr<Comm> comm,
                                                   TrainerOptions options) {
  TIDAL_RETURN_IF_ERROR(config.ValidateForWorldSize(comm->world_size()));
  if (config.optimization.gradient_compression.enabled() && config.optimization.zero_stage == 3)
    return InvalidArgument(
        "spec.optimization.gradientCompression: topk needs zeroStage 0, 1 or 2 (at stage 3 the "
        "gradient is reduce-scattered inside backward and each rank keeps only its shard)");
  if (comm->device() != options.device)
    return Internal("the process group's collectives run on " + comm->device().str() +
                    " but the trainer's tensors are on " + options.device.str());
  if (!options.data) return Internal("trainer: no training data was given to the trainer");
  std::unique_ptr<Trainer> trainer(new Trainer(config, std::move(comm), std::move(options)));
  TIDAL_RETURN_IF_ERROR(trainer->Initialize());
  return trainer;
}

Status Trainer::Initialize() {
  const auto& opt = config_.optimization;
  max_steps_ = options_.max_steps.value_or(opt.max_steps);
  TIDAL_ASSIGN_OR_RETURN(dtype_, ComputeDtype(opt.precision, options_.device));
  if (opt.micro_batch_auto) {  // before the model: on CPU its tensors count too
    TIDAL_ASSIGN_OR_RETURN(meter_options_, MemoryMeterOptionsFromEnv());
    TIDAL_ASSIGN_OR_RETURN(meter_, MakeMemoryMeter(options_.device, meter_options_));
  }

  ModelConfig model_config;
  if (!config_.model.preset.empty()) {
    TIDAL_ASSIGN_OR_RETURN(model_config, PresetModelConfig(config_.model.preset));
  } else {
    TIDAL_ASSIGN_OR_RETURN(hf_, options_.model_files
                                    ? HfCheckpoint::Open(std::move(options_.model_files))
                                    : HfCheckpoint::Open(config_.model.uri));
    model_config = hf_->config();
  }
  for (const std::string& note : model_config.notes)
    LogInfo("config.json key not acted on", {{"model", config_.model.uri}, {"note", note}});
  data_ = std::move(options_.data);
  TIDAL_RETURN_IF_ERROR(CheckJobFitsModel(config_, model_config, data_->dataset().tokenizer));
  model_ = std::make_unique<DecoderModel>(model_config, config_.lora);
  TIDAL_RETURN_IF_ERROR(StartGeneration(nullptr));
  std::tie(rope_cos_, rope_sin_) = model_->RopeTables(config_.dataset.max_seq_len, options_.device);
  LogInfo("engine ready", {{"model_type", model_config.model_type},
                           {"params_total", model_config.BaseParameterCount()},
                           {"params_active", model_config.ActiveParameterCount()},
                           {"params_trainable", params_->TrainableParameterCount()},
                           {"zero_stage", opt.zero_stage},
                           {"world_size", comm_->world_size()},
                           {"backend", comm_->backend()},
                           {"gradient_accumulation", accumulation_},
                           {"rows", data_->rows()},
                           {"samples", data_->dataset().samples},
                           {"tokenizer", data_->dataset().tokenizer.description},
                           {"resident_param_bytes", params_->ResidentParameterBytes()}});
  return OkStatus();
}

Status Trainer::StartGeneration(KeptBaseWeights* kept) {
  const auto& opt = config_.optimization;
  accumulation_ = config_.GradientAccumulation(comm_->world_size());
  step_ = 0;
  good_steps_ = 0;
  trained_seconds_ = 0;
  extensions_ = nlohmann::json::object();
  auto_micro_ = {};
  auto_agreed_ = false;
  loss_scale_ = dtype_ == torch::kFloat16 ? kInitialLossScale : 1.0;
  schedule_ = LrSchedule(ScheduleSpec());
  optimizer_.Reset();
  warmed_ = false;
  // The load's own host memory — this rank's ZeRO slices and the reads' buffers: the kernel's
  // peak restarted here (data preparation and an earlier generation of this process do not
  // count).
  const bool peak_reset = ResetPeakRss();
  const std::optional<ProcessMemory> before_load = ReadProcessMemory();
  ShardingOptions sharding{opt.zero_stage, options_.device, dtype_,
                           /*allocate_frozen_in_load=*/kept != nullptr};
  if (opt.gradient_compression.enabled()) {
    sharding.compression_groups = opt.gradient_compression.GroupsAt(comm_->world_size());
    sharding.compression_ratio = opt.gradient_compression.ratio;
  }
  try {
    params_ = std::make_unique<ShardedParameters>(*model_, *comm_, sharding);
  } catch (const std::invalid_argument& e) {
    return InvalidArgument(e.what());
  }
  const uint64_t init_seed = config_.model.init_seed;
  const auto load_start = std::chrono::steady_clock::now();
  // A large model takes minutes: a progress line every 5 s (share loaded, bytes read, ETA).
  auto last_progress = load_start;
  const uint64_t bytes_before = hf_ ? hf_->BytesRead() : 0;
  auto progress = [&](int64_t loaded, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_progress < std::chrono::seconds(5) || loaded >= total) return;
    last_progress = now;
    const double seconds = std::chrono::duration<double>(now - load_start).count();
    const double share = static_cast<double>(loaded) / static_cast<double>(total);
    nlohmann::json fields = {{"model", hf_ ? config_.model.uri : config_.model.preset},
                             {"loaded", std::round(share * 1000) / 1000},
                             {"seconds", std::round(seconds)},
                             {"eta_s", std::round(seconds * (1 - share) / share)}};
    if (hf_) fields["bytes_read"] = hf_->BytesRead() - bytes_before;
    LogInfo("loading model", fields);
  };
  TIDAL_RETURN_IF_ERROR(
      params_->Load(hf_ ? hf_->Reader(*model_, init_seed) : RandomInitReader(*model_, init_seed),
                    progress, kept));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  if (kept && !kept->retired.empty())  // returned to the kernel while the generation starts
    retiring_.emplace_back([retired = std::move(kept->retired)]() mutable { retired.clear(); });
  if (kept) {
    LogInfo("base weights kept",
            {{"model", hf_ ? config_.model.uri : config_.model.preset},
             {"world_size", comm_->world_size()},
             {"elements_from_memory", kept->reused},
             {"elements_read", kept->read},
             {"bytes_read", hf_ ? hf_->BytesRead() - bytes_before : uint64_t{0}},
             {"seconds", seconds},
             {"resident_param_bytes", params_->ResidentParameterBytes()}});
  } else if (hf_) {
    const std::optional<ProcessMemory> after_load = ReadProcessMemory();
    LogInfo("model loaded",
            {{"model", config_.model.uri},
             {"bytes_read", hf_->BytesRead()},
             {"verified", hf_->verified()},
             {"seconds", seconds},
             {"mb_per_s", std::round(hf_->BytesRead() / 1e6 / std::max(seconds, 1e-9))},
             {"resident_param_bytes", params_->ResidentParameterBytes()},
             // Host memory: the process before its slices were allocated, and its peak since
             // then when the reset worked (slices and read buffers) — what a rank held while
             // loading; -1 if unknown.
             {"rss_before_load_bytes", before_load ? before_load->rss_bytes : -1},
             {"peak_rss_bytes", after_load ? after_load->peak_rss_bytes : -1},
             {"peak_rss_since_load", peak_reset}});
  }
  return OkStatus();
}

void Trainer::LeaveGroup() {
  if (!comm_) return;
  JoinRetired();  // the last change's (done by now, unless that generation failed at once)
  kept_ = params_->ReleaseBaseWeights();
  for (size_t b = 0; b < ahead_.size() && b < kept_.blocks.size(); ++b)
    kept_.blocks[b].ahead = std::move(ahead_[b]);
  ahead_.clear();
  params_.reset();
  // Closing a gloo group's connections takes each one through the transport's event loop: tens
  // of ms on a busy host, spent while the next group connects rather than before. A NCCL
  // group is closed here, as before: its abort and the next group's init share the GPU.
  if (comm_->device().is_cpu())
    retiring_.emplace_back([comm = std::move(comm_)]() mutable { comm.reset(); });
  comm_.reset();
}

Status Trainer::ReadAhead(int rank, int world_size, const std::function<bool()>& cancelled,
                          bool* complete) {
  if (!comm_) return FailedPrecondition("trainer: reading ahead needs a generation to start from");
  const int stage = config_.optimization.zero_stage;
  const ShardPlacement from{stage, comm_->rank(), comm_->world_size()}, to{stage, rank, world_size};
  // Host memory: what it holds must fit the budget, or it is not done (the next generation's
  // Load reads in the pause, as without a read ahead). The whole next shard is assembled only
  // on the host, where the Load then takes it over instead of copying it.
  ReadAheadSize size = SizeOfReadAhead(*model_, from, to);
  if (!options_.device.is_cpu()) size.assembled = 0;
  const MemoryBudget budget = BudgetWithin(ReadMemoryHeadroom(), options_.read_ahead_max_bytes,
                                           "TIDAL_READ_AHEAD_MAX_BYTES");
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(dtype_));
  const ReadAheadFit fit = FitReadAhead(size, element_bytes, budget.bytes);
  if (fit == ReadAheadFit::kNothing)
    return FailedPrecondition("host memory: reading ahead takes " +
                              std::to_string(size.read * element_bytes) + " bytes and may take " +
                              std::to_string(budget.bytes) + ", " + budget.bound);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t bytes_before = hf_ ? hf_->BytesRead() : 0;
  const uint64_t seed = config_.model.init_seed;
  bool all = false;
  TIDAL_ASSIGN_OR_RETURN(auto segments, ReadAheadBaseWeights(*model_, from, to, dtype_,
                                                             hf_ ? hf_->Reader(*model_, seed)
                                                                 : RandomInitReader(*model_, seed),
                                                             cancelled, &all));
  if (complete) *complete = all;
  int64_t elements = 0;
  for (const auto& block : segments)
    for (const auto& segment : block) elements += segment.data.numel();
  // On the host the whole next shard is built now, to be taken over without a copy.
  const bool assemble = all && fit == ReadAheadFit::kReadAndAssemble;
  if (assemble) AssembleNextShards(*model_, to, params_->FrozenShards(), segments, cancelled);
  ahead_ = std::move(segments);
  LogInfo("base weights read ahead",
          {{"model", hf_ ? config_.model.uri : config_.model.preset},
           {"planned_rank", rank},
           {"planned_world_size", world_size},
           {"elements", elements},
           {"complete", all},
           {"assembled", assemble},
           {"host_bytes_at_most", (elements + (assemble ? size.assembled : 0)) * element_bytes},
           {"host_budget_bytes", budget.bytes},
           {"bytes_read", hf_ ? hf_->BytesRead() - bytes_before : uint64_t{0}},
           {"seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
  return OkStatus();
}

Status Trainer::JoinGroup(std::unique_ptr<Comm> comm) {
  if (comm_) return Internal("trainer: JoinGroup while still in a group (LeaveGroup first)");
  if (!params_ && kept_.blocks.empty())
    return Internal("trainer: a JoinGroup that failed left nothing to join with");
  TIDAL_RETURN_IF_ERROR(config_.ValidateForWorldSize(comm->world_size()));
  if (comm->device() != options_.device)
    return Internal("the process group's collectives run on " + comm->device().str() +
                    " but the trainer's tensors are on " + options_.device.str());
  comm_ = std::move(comm);
  KeptBaseWeights kept = std::move(kept_);
  kept_ = {};
  return StartGeneration(&kept);
}

// This rank's next `warmupPercent` of an epoch, fetched into the node-local cache before its
// first step — after a resume, from the step it resumes at.
Status Trainer::WarmData() {
  std::vector<uint64_t> first;
  const uint64_t want = data_->rows() * static_cast<uint64_t>(config_.dataset.warmup_percent) /
                        100 / static_cast<uint64_t>(comm_->world_size());
  for (int64_t s = step_; first.size() < want; ++s) {
    auto more = RankSequences(s);
    first.insert(first.end(), more.begin(), more.end());
  }
  const auto start = std::chrono::steady_clock::now();
  TIDAL_RETURN_IF_ERROR(data_->Warm(first));
  LogInfo("data cache warmed",
          {{"sequences", first.size()},
           {"from_step", step_},
           {"seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
  return OkStatus();
}

StatusOr<StepRecord> Trainer::Step() try {
  const auto& opt = config_.optimization;
  if (!opt.micro_batch_auto) return RunStep(opt.micro_batch_size, /*per_row=*/false);
  // microBatchSize: auto. The rows this rank runs each step (its share of the global batch at
  // the logical micro-batch of 1) in micro-batches of auto_micro_.size; an out-of-memory
  // that every rank agrees on is run again smaller.
  if (!auto_agreed_) TIDAL_RETURN_IF_ERROR(AgreeAutoMicroBatch());
  for (;;) {
    auto_micro_.Clamp(AutoMicroBatchRows());
    bool out_of_memory = false;
    auto record = RunStep(auto_micro_.size, /*per_row=*/true, &out_of_memory);
    if (!out_of_memory) return record;
    const int64_t failed = auto_micro_.size;
    if (failed == 1)
      return Unavailable("out of memory at micro-batch size 1 (step " + std::to_string(step_ + 1) +
                         "): " + record.status().message());
    auto_micro_.ShrinkAfterOutOfMemory(failed);
    LowerProcessOutOfMemoryCap(auto_micro_.cap);
    LogWarn("out of memory: the step runs again at a smaller micro-batch",
            {{"step", step_ + 1},
             {"from", failed},
             {"to", auto_micro_.size},
             {"cap", auto_micro_.cap},
             {"error", record.status().message()}});
  }
} catch (const c10::OutOfMemoryError& e) {
  // Outside a pass (the gradient reduction, the optimizer): the generation fails, nothing is
  // retried, the process lives on.
  return Unavailable(std::string("out of memory: ") + e.what_without_backtrace());
}

// Collective, once per generation: the least size and the least cap of any rank (a rank that
// ran out of memory in an earlier generation of its process remembers its cap; a resumed one
// has its checkpoint's), so that every rank runs the same micro-batches.
Status Trainer::AgreeAutoMicroBatch() {
  auto_agreed_ = true;
  auto_micro_.CapAt(ProcessOutOfMemoryCap().load());
  if (comm_->world_size() == 1) return OkStatus();
  // The cap as a size (none: no bound), so that the least of each is the answer.
  constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();
  auto mine = torch::tensor({auto_micro_.size, auto_micro_.cap > 0 ? auto_micro_.cap : kNoCap},
                            torch::TensorOptions(torch::kInt64).device(comm_->device()));
  auto all = torch::empty({2 * comm_->world_size()}, mine.options());
  TIDAL_RETURN_IF_ERROR(comm_->AllGather(mine, all));
  auto least = std::get<0>(all.view({comm_->world_size(), 2}).min(0)).cpu();
  auto_micro_.Agree(least[0].item<int64_t>(), least[1].item<int64_t>(), kNoCap);
  return OkStatus();
}

int64_t Trainer::AutoMicroBatchRows() const {
  // Under gradient compression a pass holds one group's rows at most.
  const int64_t groups = std::max<int64_t>(1, params_->local_groups());
  return accumulation_ / groups;
}

// What a step does, in order: plan its passes, read ahead, run each pass (forward, backward,
// an out-of-memory settled between the ranks), reduce the gradients, one all-reduce of the
// step's figures (with the auto micro-batch's memory verdicts), the update.
StatusOr<StepRecord> Trainer::RunStep(int64_t micro, bool per_row, bool* out_of_memory) {
  const auto start = std::chrono::steady_clock::now();
  StepTally tally;
  tally.micro = micro;
  tally.per_row = per_row;
  // An out-of-memory mid-step is agreed on by every rank before any collective of the next
  // micro-batch: possible where a micro-batch's forward and backward hold none (ZeRO 0-2).
  tally.agree_out_of_memory = per_row && comm_->world_size() > 1 && params_->options().stage <= 2;
  // Gradient compression after the dense warm-up: this rank's rows are its groups' (each a
  // whole number of logical micro-batches), no pass across two. The exchanges overlap the last
  // backward unless the ranks still agree on an out-of-memory after it.
  const auto& compression = config_.optimization.gradient_compression;
  tally.compress = compression.enabled() && step_ >= compression.warmup_steps;
  params_->BeginStep(tally.compress, loss_scale_, /*overlap=*/!tally.agree_out_of_memory);
  const std::vector<Pass> passes = PlanPasses(micro, tally.compress ? params_->local_groups() : 1);
  // What this thread allocates during the step is what the meter counts (CPU).
  struct Counting {
    MemoryMeter* meter;
    explicit Counting(MemoryMeter* m) : meter(m) {
      if (meter) meter->CountThisThread(true);
    }
    ~Counting() {
      if (meter) meter->CountThisThread(false);
    }
  } counting(meter_.get());
  if (meter_) {
    meter_->ResetPeak();
    tally.base_bytes = meter_->InUse();
  }
  const auto on_device = torch::TensorOptions(torch::kFloat64).device(comm_->device());
  tally.loss = torch::zeros({}, on_device);
  tally.tokens = torch::zeros({}, on_device);
  tally.moe = model_->config().moe.n_routed_experts > 0;
  if (!warmed_ && config_.dataset.warmup_percent > 0) TIDAL_RETURN_IF_ERROR(WarmData());
  warmed_ = true;
  tally.ahead = RowsAhead();
  for (size_t a = 0; a < passes.size(); ++a) {
    std::string failure;
    TIDAL_RETURN_IF_ERROR(RunPass(passes[a], /*first=*/a == 0, tally, &failure));
    TIDAL_RETURN_IF_ERROR(SettleOutOfMemory(tally, &failure));
    if (!failure.empty()) {
      params_->DiscardGradients();
      *out_of_memory = true;
      return Unavailable(failure);
    }
    TIDAL_RETURN_IF_ERROR(params_->AfterMicroBatchBackward());
    if (tally.moe) {
      std::vector<torch::Tensor> layers;
      for (const auto& [layer, counts] : tally.routed.expert_tokens) layers.push_back(counts);
      auto counts = torch::stack(layers);
      tally.expert_tokens = tally.expert_tokens.defined() ? tally.expert_tokens + counts : counts;
    }
  }
  TIDAL_ASSIGN_OR_RETURN(std::vector<TrainableSlice> slices, params_->ReduceGradients());
  const ShardedParameters::GradientTraffic traffic = params_->traffic();
  TIDAL_ASSIGN_OR_RETURN(StepRecord record, ReduceStepFigures(tally, slices));
  ApplyUpdate(record, slices);
  TIDAL_RETURN_IF_ERROR(params_->FinishStep(/*keep_residuals=*/!record.skipped));
  record.compressed = tally.compress;
  record.gradient_bytes = traffic.payload_bytes;
  record.compress_seconds = traffic.compress_seconds;
  record.exchange_wait_seconds = traffic.exchange_wait_seconds;
  ++step_;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trained_seconds_ += record.seconds;
  record.tokens_per_s = tally.step_tokens / record.seconds;  // all ranks, no padding
  record.data_wait_seconds = tally.data_wait;
  return record;
}

// This rank's rows of the step (its accumulation × the logical micro-batch) in passes of at
// most `micro` rows, each inside one of `groups` compression groups.
std::vector<Trainer::Pass> Trainer::PlanPasses(int64_t micro, int64_t groups) const {
  const int64_t rows_per_group = accumulation_ * config_.optimization.micro_batch_size / groups;
  std::vector<Pass> plan;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows_per_group; r += micro)
      plan.push_back({g * rows_per_group + r, std::min(micro, rows_per_group - r), g,
                      r + micro >= rows_per_group});
  return plan;
}

// The next `lookahead` rows this rank reads, handed to the background fetchers before each
// micro-batch (a step may read more rows than the lookahead).
std::vector<uint64_t> Trainer::RowsAhead() const {
  const size_t rows_per_rank =
      static_cast<size_t>(accumulation_ * config_.optimization.micro_batch_size);
  std::vector<uint64_t> ahead;
  for (int64_t s = step_;
       ahead.size() < static_cast<size_t>(config_.dataset.lookahead) + rows_per_rank; ++s) {
    auto more = RankSequences(s);
    ahead.insert(ahead.end(), more.begin(), more.end());
  }
  return ahead;
}

Status Trainer::RunPass(const Pass& pass, bool first, StepTally& tally, std::string* failure) {
  const auto& opt = config_.optimization;
  const int64_t global = opt.global_batch_size;
  // The loss is each logical micro-batch's token mean (spec.optimization.microBatchSize rows;
  // 1 under auto) over the global batch, whatever rows a forward pass groups.
  const int64_t micro_batches = global / opt.micro_batch_size;  // logical ones, over all ranks
  const int64_t rows_per_rank = accumulation_ * opt.micro_batch_size;
  const uint64_t step_key = MixSeed(opt.seed, static_cast<uint64_t>(step_));
  // This rank's rows are contiguous in the global batch; a row's sequence and dropout masks
  // depend on (step, its index) only, so the run is the same at any world size.
  const int64_t rows_here = pass.rows;
  params_->SetMicroBatchGroup(pass.group, pass.last_of_group);
  const int64_t first_sequence = comm_->rank() * rows_per_rank + pass.first_row;
  try {
    // An injected failure (TIDAL_TEST_OOM_AT_STEP) is armed for the step's first pass and
    // disarmed when it ends, fired or not: it can only fire inside the try.
    struct Disarm {
      MemoryMeter* meter;
      ~Disarm() {
        if (meter) meter->CancelFailure();
      }
    } disarm{meter_.get()};
    if (meter_ && first && meter_options_.test_oom_at_step == step_ + 1 && !oom_injected_) {
      oom_injected_ = true;
      meter_->FailNextAllocation(64 << 10);
    }
    if (meter_) meter_->Check();
    const auto data_start = std::chrono::steady_clock::now();
    data_->Prefetch(
        std::span<const uint64_t>(tally.ahead).subspan(static_cast<size_t>(pass.first_row)));
    std::vector<PackedRow> rows;
    for (int64_t i = 0; i < rows_here; ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          PackedRow row,
          data_->Sequence(static_cast<uint64_t>(step_ * global + first_sequence + i)));
      rows.push_back(std::move(row));
    }
    MicroBatch batch = Collate(rows);
    ForwardContext ctx;
    ctx.tokens = batch.inputs.to(options_.device);
    ctx.targets = batch.targets.to(options_.device);
    const int64_t seq = batch.inputs.size(1);
    auto positions = batch.positions.reshape({-1}).to(options_.device);
    ctx.rope_cos = rope_cos_.index_select(0, positions).view({rows_here, 1, seq, -1});
    ctx.rope_sin = rope_sin_.index_select(0, positions).view({rows_here, 1, seq, -1});
    if (batch.attention.defined()) ctx.attention = batch.attention.to(options_.device);
    tally.tokens += static_cast<double>(batch.tokens);
    tally.data_wait +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - data_start).count();
    ctx.training = true;
    // Fixed micro-batches: one key per (logical = physical) micro-batch, its global index.
    // Per row: each row the key and the loss weight it has run alone as a micro-batch of 1.
    ctx.dropout_key = MixSeed(step_key, static_cast<uint64_t>(first_sequence / tally.micro));
    if (tally.per_row) {
      for (int64_t i = 0; i < rows_here; ++i)
        ctx.row_dropout_keys.push_back(
            MixSeed(step_key, static_cast<uint64_t>(first_sequence + i)));
      ctx.row_loss_weights =
          1.0 / (batch.targets != -100).sum(1).clamp_min(1).to(torch::kFloat32).to(options_.device);
    }
    if (tally.moe) ctx.moe = &tally.routed;
    TIDAL_ASSIGN_OR_RETURN(torch::Tensor loss_sum, params_->Forward(ctx));
    const double tokens = static_cast<double>(batch.target_tokens);
    auto micro_loss = tally.per_row ? loss_sum : loss_sum / std::max(tokens, 1.0);
    try {
      (micro_loss * (loss_scale_ / static_cast<double>(micro_batches))).backward();
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const std::exception& e) {
      return Unavailable(std::string("backward: ") + e.what());
    }
    tally.loss += micro_loss.detach().to(torch::kFloat64) / static_cast<double>(micro_batches);
  } catch (const c10::OutOfMemoryError& e) {
    *failure = e.what_without_backtrace();
  }
  return OkStatus();
}

// After a pass: an out-of-memory (this rank's, in *failure, or another's) either ends the step
// to be run again smaller (*failure set, the ranks agreed) or the generation (an error).
Status Trainer::SettleOutOfMemory(StepTally& tally, std::string* failure) {
  if (!tally.per_row && !failure->empty()) return Unavailable("out of memory: " + *failure);
  if (tally.agree_out_of_memory) {
    std::vector<int64_t> failed{failure->empty() ? 0 : 1};
    TIDAL_RETURN_IF_ERROR(comm_->AllReduceSumHost(failed));
    if (failed[0] > 0 && failure->empty())
      *failure = std::to_string(failed[0]) + " rank(s) ran out of memory";
  } else if (!failure->empty() && comm_->world_size() > 1) {
    // ZeRO-3 gathers parameters inside the forward pass: the other ranks wait in a collective
    // this rank cannot rejoin, so the generation fails (and the next starts smaller).
    auto_micro_.cap = std::max<int64_t>(1, tally.micro - 1);  // the next generation's bound
    LowerProcessOutOfMemoryCap(auto_micro_.cap);
    return Unavailable("out of memory at micro-batch size " + std::to_string(tally.micro) +
                       " under ZeRO stage 3 with other ranks (their collectives cannot be "
                       "resumed mid-pass): " +
                       *failure);
  }
  return OkStatus();
}

// One all-reduce for the step's loss, tokens, squared gradient norm (when the slices are
// partitioned), the experts' token counts, and the auto micro-batch's memory verdicts; one host
// sync for all.
StatusOr<StepRecord> Trainer::ReduceStepFigures(StepTally& tally,
                                                const std::vector<TrainableSlice>& slices) {
  const auto& opt = config_.optimization;
  const int64_t micro = tally.micro;
  torch::Tensor norm_sq_local = SquaredGradNorm(slices).to(comm_->device());
  const bool partitioned = params_->slices_are_partitioned();
  auto stats = torch::stack(
      {tally.loss, partitioned ? norm_sq_local : torch::zeros_like(tally.loss), tally.tokens});
  if (tally.moe)  // the experts' token counts ride on the same all-reduce (exact in fp64)
    stats = torch::cat({stats, tally.expert_tokens.flatten().to(stats.options())});
  // microBatchSize auto: whether this rank's memory keeps the next size out (its peak so far
  // scaled to it would pass the target) and whether it is over the target now; ranks that
  // disagree would run different micro-batches, so the sums decide for all.
  int64_t peak_bytes = -1, next_micro = micro;
  if (tally.per_row && meter_) {
    peak_bytes = meter_->Peak();
    next_micro = auto_micro_.Next(AutoMicroBatchRows());
    const double target = static_cast<double>(meter_->limit()) * opt.memory_target_percent / 100;
    const auto verdict =
        AutoMicroBatch::Judge(micro, next_micro, tally.base_bytes, peak_bytes, target);
    stats =
        torch::cat({stats, torch::tensor({verdict.blocked ? 1.0 : 0.0, verdict.over ? 1.0 : 0.0},
                                         stats.options())});
  }
  TIDAL_RETURN_IF_ERROR(comm_->AllReduceSum(stats));
  if (!partitioned) stats[1].copy_(norm_sq_local);
  stats = stats.cpu();
  StepRecord record;
  if (tally.per_row && meter_) {
    const int64_t n = stats.size(0);
    const bool blocked = stats[n - 2].item<double>() > 0, over = stats[n - 1].item<double>() > 0;
    const std::string reason = auto_micro_.After(micro, next_micro, blocked, over);
    if (!reason.empty() && comm_->rank() == 0)
      LogInfo("micro-batch size", {{"step", step_ + 1},
                                   {"from", micro},
                                   {"to", auto_micro_.size},
                                   {"reason", reason},
                                   {"peak_bytes", peak_bytes},
                                   {"limit_bytes", meter_->limit()},
                                   {"memory_target_percent", opt.memory_target_percent}});
  }
  record.micro_batch = micro;
  record.peak_memory_bytes = peak_bytes;
  record.step = step_ + 1;
  record.loss = stats[0].item<double>();
  record.grad_norm = std::sqrt(stats[1].item<double>()) / loss_scale_;
  tally.step_tokens = stats[2].item<double>();
  record.world_size = comm_->world_size();
  if (tally.moe) {
    auto counts = stats.narrow(0, 3, tally.expert_tokens.numel())
                      .to(torch::kInt64)
                      .view(tally.expert_tokens.sizes())
                      .contiguous();
    for (const auto& [layer, unused] : tally.routed.expert_tokens)
      record.moe_layers.push_back(layer);
    for (int64_t l = 0; l < counts.size(0); ++l) {
      auto row = counts[l];
      record.expert_tokens.emplace_back(row.data_ptr<int64_t>(),
                                        row.data_ptr<int64_t>() + row.numel());
    }
  }
  return record;
}

// The optimizer's update, clipped; never a NaN/Inf into the weights. fp16: a non-finite norm
// means the loss scale overflowed: it is lowered and training goes on (as DeepSpeed/apex);
// fp32/bf16: the update is dropped and the step reported skipped.
void Trainer::ApplyUpdate(StepRecord& record, std::vector<TrainableSlice>& slices) {
  const auto& opt = config_.optimization;
  if (!std::isfinite(record.grad_norm)) {
    record.skipped = true;
    if (loss_scale_ > 1.0) {
      loss_scale_ /= 2;
      good_steps_ = 0;
    }
    LogWarn("non-finite gradient norm; update skipped",
            {{"step", record.step}, {"loss", record.loss}, {"loss_scale", loss_scale_}});
    return;
  }
  const double clip = opt.grad_clip > 0 && record.grad_norm > opt.grad_clip
                          ? opt.grad_clip / (record.grad_norm + 1e-6)
                          : 1.0;
  record.lr = schedule_.Next(record.grad_norm);
  optimizer_.Step(slices, record.lr, clip / loss_scale_);
  if (loss_scale_ > 1.0 && ++good_steps_ % kLossScaleWindow == 0) loss_scale_ *= 2;
}

// What decides which rows sequence k is: the store's content and the packing options.
std::string Trainer::DataKey() const {
  return data_->dataset().content_hash + (config_.dataset.packing ? "/packed/" : "/unpacked/") +
         config_.dataset.overlong;
}

std::vector<uint64_t> Trainer::RankSequences(int64_t step) const {
  const int64_t global = config_.optimization.global_batch_size;
  const int64_t micro = config_.optimization.micro_batch_size;
  const int64_t first = step * global + comm_->rank() * accumulation_ * micro;
  std::vector<uint64_t> out;
  for (int64_t i = 0; i < accumulation_ * micro; ++i)
    out.push_back(static_cast<uint64_t>(first + i));
  return out;
}

nlohmann::json Trainer::StateJson() const {
  return {{"step", step_},
          {"lrSchedule", schedule_.StateJson()},
          {"lossScale", loss_scale_},
          {"goodSteps", good_steps_},
          {"optimizerSteps", optimizer_.steps()},
          {"gradientAccumulation", accumulation_},
          {"worldSize", comm_->world_size()},
          {"seed", config_.optimization.seed},
          {"data", DataKey()},
          {"trainedSeconds", trained_seconds_},
          {"extensions", extensions_},
          {"microBatch", {{"size", auto_micro_.size}, {"cap", auto_micro_.cap}}}};
}

Status Trainer::RestoreState(const nlohmann::json& state) {
  auto field = [&](const char* key) -> const nlohmann::json* {
    return state.is_object() && state.contains(key) ? &state[key] : nullptr;
  };
  const nlohmann::json* step = field("step");
  if (!step || !step->is_number_integer() || step->get<int64_t>() < 0)
    return InvalidArgument("trainer state: step: expected a non-negative integer");
  const nlohmann::json* seed = field("seed");
  if (!seed || !seed->is_number_unsigned() || seed->get<uint64_t>() != config_.optimization.seed)
    return InvalidArgument("trainer state: seed: the checkpoint was trained with another seed");
  // The data cursor (the step) means the same rows only over the same store.
  if (const nlohmann::json* data = field("data"); data && data->is_string() && *data != DataKey())
    return InvalidArgument("trainer state: data: the checkpoint was trained on rows " +
                           data->get<std::string>() + ", this run reads " + DataKey() +
                           " (the dataset, the tokenizer, spec.dataset.packing or overlong "
                           "changed); resuming would continue on other rows");
  const nlohmann::json* scale = field("lossScale");
  const nlohmann::json* good = field("goodSteps");
  if (!scale || !scale->is_number() || !good || !good->is_number_integer())
    return InvalidArgument("trainer state: lossScale/goodSteps: expected numbers");
  const nlohmann::json* schedule = field("lrSchedule");
  if (!schedule) return InvalidArgument("trainer state: lrSchedule: required");
  TIDAL_RETURN_IF_ERROR(schedule_.RestoreState(*schedule));
  // Both absent from checkpoints written before they existed: the job's training time then
  // counts from this resume, and the extensions start empty.
  const nlohmann::json* trained = field("trainedSeconds");
  if (trained && (!trained->is_number() || !(trained->get<double>() >= 0)))
    return InvalidArgument("trainer state: trainedSeconds: expected a number >= 0");
  const nlohmann::json* extensions = field("extensions");
  if (extensions && !extensions->is_object())
    return InvalidArgument("trainer state: extensions: expected an object");
  // The size microBatchSize auto chose, kept across restarts and rescales (clamped to the rows
  // a rank has at the new world size when the step runs); absent from older checkpoints.
  AutoMicroBatch chosen;
  if (const nlohmann::json* micro = field("microBatch")) {
    const auto size = micro->is_object() ? micro->find("size") : micro->end();
    const auto cap = micro->is_object() ? micro->find("cap") : micro->end();
    if (size == micro->end() || !size->is_number_integer() || size->get<int64_t>() < 1 ||
        cap == micro->end() || !cap->is_number_integer() || cap->get<int64_t>() < 0)
      return InvalidArgument("trainer state: microBatch: expected {size >= 1, cap >= 0}");
    chosen = {size->get<int64_t>(), cap->get<int64_t>()};
  }
  step_ = step->get<int64_t>();
  loss_scale_ = scale->get<double>();
  good_steps_ = good->get<int64_t>();
  trained_seconds_ = trained ? trained->get<double>() : 0;
  extensions_ = extensions ? *extensions : nlohmann::json::object();
  auto_micro_ = chosen;
  return OkStatus();
}

}  // namespace tidal::engine
