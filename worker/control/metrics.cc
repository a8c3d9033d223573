#include "worker/control/metrics.h"

#include "common/metrics/endpoint.h"

namespace tidal::worker {
namespace {

template <typename Builder>
auto& Family(Builder builder, const char* name, const char* help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& trainingjob)
    : registry_(std::make_shared<prometheus::Registry>()), job_{{"trainingjob", trainingjob}} {
  const prometheus::Labels& job = job_;
  auto& r = *registry_;
  auto gauge = [&](const char* name, const char* help) {
    return &Family(prometheus::BuildGauge(), name, help, r).Add(job);
  };
  auto counter = [&](const char* name, const char* help) {
    return &Family(prometheus::BuildCounter(), name, help, r).Add(job);
  };
  // 10 ms to ~5.8 min per optimizer step: a tiny CPU model to a large one on few GPUs.
  step_duration_ = &Family(prometheus::BuildHistogram(), "tidal_worker_step_duration_seconds",
                           "Wall time of one optimizer step (all micro-batches), in seconds.", r)
                        .Add(job, metrics::ExponentialBuckets(0.01, 2, 16));
  // 100 µs to ~3.3 s per step: an in-memory corpus to a loader that cannot keep up.
  data_wait_ = &Family(prometheus::BuildHistogram(), "tidal_worker_data_wait_seconds",
                       "Time one optimizer step spent waiting for its micro-batches (reading "
                       "them and moving them to the device), in seconds.",
                       r)
                    .Add(job, metrics::ExponentialBuckets(0.0001, 2, 16));
  steps_ = counter("tidal_worker_steps_total", "Optimizer steps this worker process trained.");
  skipped_steps_ = counter("tidal_worker_skipped_steps_total",
                           "Optimizer steps skipped for an fp16 overflow (loss scale lowered).");
  step_ = gauge("tidal_worker_step", "The job's optimizer step this worker last finished.");
  tokens_per_second_ = gauge("tidal_worker_tokens_per_second",
                             "Training throughput of the whole job over the last step, in "
                             "tokens per second.");
  loss_ = gauge("tidal_worker_loss",
                "Mean token cross-entropy loss over the last step's global batch.");
  learning_rate_ = gauge("tidal_worker_learning_rate", "Learning rate of the last step.");
  grad_norm_ =
      gauge("tidal_worker_grad_norm", "L2 norm of the last step's gradient, before clipping.");
  micro_batch_ = gauge("tidal_worker_micro_batch_size",
                       "Sequences per forward pass the last step ran at (chosen by the engine "
                       "under spec.optimization.microBatchSize auto).");
  gradient_bytes_ = gauge("tidal_worker_gradient_bytes",
                          "Bytes this rank handed to its gradient collectives in the last step "
                          "(top-k values and indices under spec.optimization.gradientCompression "
                          "once its dense warm-up is over).");
  generation_ = gauge("tidal_worker_generation",
                      "The membership generation this worker last joined (DESIGN.md §4).");
  rank_ = gauge("tidal_worker_rank", "This worker's rank in its generation.");
  world_size_ = gauge("tidal_worker_world_size", "Ranks in this worker's generation.");

  auto& duration = Family(prometheus::BuildHistogram(), "tidal_worker_checkpoint_duration_seconds",
                          "Time from a checkpoint's copy at the step boundary to its commit, "
                          "in seconds, by kind (full, snapshot).",
                          r);
  auto& bytes = Family(prometheus::BuildCounter(), "tidal_worker_checkpoint_written_bytes_total",
                       "Bytes of checkpoint shards this worker wrote, by kind.", r);
  auto& count = Family(prometheus::BuildCounter(), "tidal_worker_checkpoints_total",
                       "Checkpoints committed that this worker wrote a shard of, by kind.", r);
  auto& failures = Family(prometheus::BuildCounter(), "tidal_worker_checkpoint_failures_total",
                          "Checkpoints this worker took part in that were not committed (a "
                          "write or the commit failed on some rank), by kind.",
                          r);
  for (auto kind : {checkpoint::CheckpointKind::kFull, checkpoint::CheckpointKind::kSnapshot}) {
    prometheus::Labels labels = job;
    labels["kind"] = checkpoint::KindName(kind);
    // 50 ms to ~14 min: a LoRA snapshot to a full ZeRO-3 checkpoint over S3.
    checkpoints_[kind] = {&duration.Add(labels, metrics::ExponentialBuckets(0.05, 2, 15)),
                          &bytes.Add(labels), &count.Add(labels), &failures.Add(labels)};
  }
}

void WorkerMetrics::OnGeneration(int64_t generation, int rank, int world_size) {
  generation_->Set(static_cast<double>(generation));
  rank_->Set(rank);
  world_size_->Set(world_size);
}

void WorkerMetrics::OnStep(const engine::StepRecord& record, const std::optional<GpuSample>& gpu) {
  step_duration_->Observe(record.seconds);
  steps_->Increment();
  if (record.skipped) skipped_steps_->Increment();
  step_->Set(static_cast<double>(record.step));
  tokens_per_second_->Set(record.tokens_per_s);
  loss_->Set(record.loss);
  learning_rate_->Set(record.lr);
  grad_norm_->Set(record.grad_norm);
  micro_batch_->Set(static_cast<double>(record.micro_batch));
  gradient_bytes_->Set(static_cast<double>(record.gradient_bytes));
  data_wait_->Observe(record.data_wait_seconds);
  if (!record.expert_tokens.empty()) {
    if (!expert_tokens_) {
      expert_tokens_ = &Family(prometheus::BuildGauge(), "tidal_worker_expert_tokens",
                               "Tokens routed to each routed expert over the last step's global "
                               "batch, summed over the mixture-of-experts layers (by expert).",
                               *registry_);
      moe_imbalance_ = &Family(prometheus::BuildGauge(), "tidal_worker_moe_imbalance",
                               "Load balance of each mixture-of-experts layer over the last step: "
                               "the busiest expert's tokens over the mean (1 = even; by layer).",
                               *registry_);
    }
    std::vector<int64_t> per_expert(record.expert_tokens[0].size(), 0);
    for (const auto& layer : record.expert_tokens)
      for (size_t e = 0; e < layer.size(); ++e) per_expert[e] += layer[e];
    for (size_t e = 0; e < per_expert.size(); ++e) {
      prometheus::Labels labels = job_;
      labels["expert"] = std::to_string(e);
      expert_tokens_->Add(labels).Set(static_cast<double>(per_expert[e]));
    }
    const auto imbalance = record.MoeImbalance();
    for (size_t l = 0; l < imbalance.size(); ++l) {
      prometheus::Labels labels = job_;
      labels["layer"] = std::to_string(record.moe_layers.at(l));
      moe_imbalance_->Add(labels).Set(imbalance[l]);
    }
  }
  if (!gpu) return;
  if (!gpu_) {
    auto& r = *registry_;
    gpu_ = GpuSeries{
        &Family(prometheus::BuildGauge(), "tidal_worker_gpu_utilization_ratio",
                "Fraction of the last NVML sample period in which the pod's GPUs ran a kernel "
                "(0 to 1, mean over its GPUs).",
                r)
             .Add(job_),
        &Family(prometheus::BuildGauge(), "tidal_worker_gpu_memory_used_bytes",
                "GPU memory in use on the pod's GPUs (NVML), in bytes.", r)
             .Add(job_),
        &Family(prometheus::BuildGauge(), "tidal_worker_gpu_memory_total_bytes",
                "GPU memory of the pod's GPUs (NVML), in bytes.", r)
             .Add(job_)};
  }
  gpu_->utilization->Set(gpu->utilization_percent / 100);
  gpu_->memory_used->Set(static_cast<double>(gpu->memory_used_bytes));
  gpu_->memory_total->Set(static_cast<double>(gpu->memory_total_bytes));
}

void WorkerMetrics::OnCheckpoint(const checkpoint::CommitInfo& commit) {
  auto it = checkpoints_.find(commit.kind);
  if (it == checkpoints_.end()) return;
  it->second.duration->Observe(commit.seconds);
  it->second.bytes->Increment(static_cast<double>(commit.shard_bytes));
  it->second.count->Increment();
}

void WorkerMetrics::OnCheckpointFailed(checkpoint::CheckpointKind kind, const Status&) {
  auto it = checkpoints_.find(kind);
  if (it != checkpoints_.end()) it->second.failures->Increment();
}

}  // namespace tidal::worker
