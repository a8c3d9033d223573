// worker/engine/trainer.cc
#include "worker/engine/trainer.h"

#include <cmath>

#include "common/log.h"
#include "worker/engine/hf_checkpoint.h"

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

}  // namespace

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm, TrainerOptions options)
    : config_(config),
      comm_(std::move(comm)),
      options_(options),
      optimizer_(AdamWOptions{config.optimization.beta1, config.optimization.beta2,
                              config.optimization.eps, config.optimization.weight_decay,
                              config.optimization.offload_optimizer == "cpu"}),
      schedule_([&] {
        OptimizationSpec spec = config.optimization;
        if (options.max_steps) spec.max_steps = *options.max_steps;
        return spec;
      }()) {}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                   std::unique_ptr<Comm> comm,
                                                   TrainerOptions options) {
  TIDAL_RETURN_IF_ERROR(config.ValidateForWorldSize(comm->world_size()));
  if (comm->device() != options.device)
    return Internal("the process group's collectives run on " + comm->device().str() +
                    " but the trainer's tensors are on " + options.device.str());
  std::unique_ptr<Trainer> trainer(new Trainer(config, std::move(comm), options));
  TIDAL_RETURN_IF_ERROR(trainer->Initialize());
  return trainer;
}

Status Trainer::Initialize() {
  const auto& opt = config_.optimization;
  max_steps_ = options_.max_steps.value_or(opt.max_steps);
  accumulation_ = config_.GradientAccumulation(comm_->world_size());
  TIDAL_ASSIGN_OR_RETURN(auto dtype, ComputeDtype(opt.precision, options_.device));
  if (dtype == torch::kFloat16) loss_scale_ = kInitialLossScale;

  std::unique_ptr<HfCheckpoint> hf;
  ModelConfig model_config;
  if (!config_.model.preset.empty()) {
    TIDAL_ASSIGN_OR_RETURN(model_config, PresetModelConfig(config_.model.preset));
  } else {
    TIDAL_ASSIGN_OR_RETURN(hf, HfCheckpoint::Open(config_.model.uri));
    model_config = hf->config();
  }
  TIDAL_RETURN_IF_ERROR(CheckLoraRankFits(config_.lora, model_config));
  if (model_config.vocab_size < ByteTokenizer::kVocabSize)
    return InvalidArgument("spec.model: vocab_size " + std::to_string(model_config.vocab_size) +
                           " is smaller than the byte tokenizer's " +
                           std::to_string(ByteTokenizer::kVocabSize) + " tokens");
  if (config_.dataset.max_seq_len > model_config.max_position_embeddings)
    return InvalidArgument(
        "spec.dataset.maxSeqLen: " + std::to_string(config_.dataset.max_seq_len) +
        " exceeds the model's max_position_embeddings " +
        std::to_string(model_config.max_position_embeddings));
  model_ = std::make_unique<DecoderModel>(model_config, config_.lora);
  params_ = std::make_unique<ShardedParameters>(
      *model_, *comm_, ShardingOptions{opt.zero_stage, options_.device, dtype});
  const uint64_t init_seed = config_.model.init_seed;
  TIDAL_RETURN_IF_ERROR(
      params_->Load(hf ? hf->Reader(*model_, init_seed) : RandomInitReader(*model_, init_seed)));
  TIDAL_ASSIGN_OR_RETURN(auto data, PackedTextDataset::Load(config_.dataset.uri,
                                                            config_.dataset.max_seq_len, opt.seed));
  data_ = std::move(data);
  std::tie(rope_cos_, rope_sin_) = model_->RopeTables(config_.dataset.max_seq_len, options_.device);
  LogInfo("engine ready", {{"params_total", model_config.BaseParameterCount()},
                           {"params_trainable", params_->TrainableParameterCount()},
                           {"zero_stage", opt.zero_stage},
                           {"world_size", comm_->world_size()},
                           {"backend", comm_->backend()},
                           {"gradient_accumulation", accumulation_},
                           {"sequences", data_->num_sequences()},
                           {"resident_param_bytes", params_->ResidentParameterBytes()}});
  return OkStatus();
}

StatusOr<StepRecord> Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  const auto& opt = config_.optimization;
  const int64_t global = opt.global_batch_size, micro = opt.micro_batch_size;
  const int64_t micro_batches = global / micro;  // over all ranks
  // The loss stays on the device until the step's one all-reduce: no host sync per micro-batch.
  torch::Tensor local_loss =
      torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(comm_->device()));
  double data_wait = 0;
  for (int64_t a = 0; a < accumulation_; ++a) {
    // Global micro-batch index: contiguous per rank. Its sequences and dropout masks depend
    // on (step, index) only, so the run is the same at any world size.
    const int64_t index = comm_->rank() * accumulation_ + a;
    const auto data_start = std::chrono::steady_clock::now();
    MicroBatch batch = data_->Sequences(step_ * global + index * micro, micro);
    ForwardContext ctx;
    ctx.tokens = batch.inputs.to(options_.device);
    ctx.targets = batch.targets.to(options_.device);
    data_wait +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - data_start).count();
    ctx.rope_cos = rope_cos_;
    ctx.rope_sin = rope_sin_;
    ctx.training = true;
    ctx.dropout_key = MixSeed(MixSeed(opt.seed, static_cast<uint64_t>(step_)), index);
    TIDAL_ASSIGN_OR_RETURN(torch::Tensor loss_sum, params_->Forward(ctx));
    const double tokens = static_cast<double>((batch.targets != -100).sum().item<int64_t>());
    auto micro_loss = loss_sum / std::max(tokens, 1.0);
    try {
      (micro_loss * (loss_scale_ / static_cast<double>(micro_batches))).backward();
    } catch (const std::exception& e) {
      return Unavailable(std::string("backward: ") + e.what());
    }
    local_loss += micro_loss.detach().to(torch::kFloat64) / static_cast<double>(micro_batches);
    TIDAL_RETURN_IF_ERROR(params_->AfterMicroBatchBackward());
  }
  TIDAL_ASSIGN_OR_RETURN(auto slices, params_->ReduceGradients());
  torch::Tensor norm_sq_local = SquaredGradNorm(slices).to(comm_->device());
  // One all-reduce for the loss and, when slices are partitioned, the squared norm; one host
  // sync for both.
  const bool partitioned = params_->slices_are_partitioned();
  auto stats =
      torch::stack({local_loss, partitioned ? norm_sq_local : torch::zeros_like(local_loss)});
  TIDAL_RETURN_IF_ERROR(comm_->AllReduceSum(stats));
  if (!partitioned) stats[1].copy_(norm_sq_local);
  stats = stats.cpu();
  StepRecord record;
  record.step = step_ + 1;
  record.loss = stats[0].item<double>();
  double norm_sq = stats[1].item<double>();
  record.grad_norm = std::sqrt(norm_sq) / loss_scale_;
  record.world_size = comm_->world_size();

  if (!std::isfinite(record.grad_norm)) {
    // Never write a NaN/Inf into the weights. fp16: the loss scale overflowed, lower it and
    // go on (as DeepSpeed/apex); fp32/bf16: the update is dropped and the step reported.
    record.skipped = true;
    if (loss_scale_ > 1.0) {
      loss_scale_ /= 2;
      good_steps_ = 0;
    }
    LogWarn("non-finite gradient norm; update skipped",
            {{"step", record.step}, {"loss", record.loss}, {"loss_scale", loss_scale_}});
  } else {
    const double clip = opt.grad_clip > 0 && record.grad_norm > opt.grad_clip
                            ? opt.grad_clip / (record.grad_norm + 1e-6)
                            : 1.0;
    record.lr = schedule_.Next(record.grad_norm);
    optimizer_.Step(slices, record.lr, clip / loss_scale_);
    if (loss_scale_ > 1.0 && ++good_steps_ % kLossScaleWindow == 0) loss_scale_ *= 2;
  }
  TIDAL_RETURN_IF_ERROR(params_->FinishStep());
  ++step_;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record.tokens_per_s = static_cast<double>(global * config_.dataset.max_seq_len) / record.seconds;
  record.data_wait_seconds = data_wait;
  return record;
}

nlohmann::json Trainer::StateJson() const {
  return {{"step", step_},
          {"lrSchedule", schedule_.StateJson()},
          {"lossScale", loss_scale_},
          {"goodSteps", good_steps_},
          {"optimizerSteps", optimizer_.steps()},
          {"gradientAccumulation", accumulation_},
          {"worldSize", comm_->world_size()},
          {"seed", config_.optimization.seed}};
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
  const nlohmann::json* scale = field("lossScale");
  const nlohmann::json* good = field("goodSteps");
  if (!scale || !scale->is_number() || !good || !good->is_number_integer())
    return InvalidArgument("trainer state: lossScale/goodSteps: expected numbers");
  const nlohmann::json* schedule = field("lrSchedule");
  if (!schedule) return InvalidArgument("trainer state: lrSchedule: required");
  TIDAL_RETURN_IF_ERROR(schedule_.RestoreState(*schedule));
  step_ = step->get<int64_t>();
  loss_scale_ = scale->get<double>();
  good_steps_ = good->get<int64_t>();
  return OkStatus();
}

}  // namespace tidal::engine
