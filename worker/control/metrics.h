// worker/control/metrics.h — every metric a worker exports (DESIGN.md §7), defined here and
// nowhere else, fed by the runtime as it trains (RuntimeObserver). Every series carries the
// label trainingjob ("job" is Prometheus' own target label); the scrape adds pod and
// namespace. GPU utilisation and memory come from NVML (gpu_monitor.h) and their series appear
// with the first sample: on a CPU worker there is none, and a made-up number would be worse
// than an absent series. The experts' load (tidal_worker_expert_tokens, by expert, and
// tidal_worker_moe_imbalance, by layer) appears with the first step of a mixture-of-experts
// model.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "worker/control/runtime.h"

namespace tidal::worker {

class WorkerMetrics : public RuntimeObserver {
 public:
  explicit WorkerMetrics(const std::string& trainingjob);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void OnGeneration(int64_t generation, int rank, int world_size) override;
  void OnStep(const engine::StepRecord& record, const std::optional<GpuSample>& gpu) override;
  void OnCheckpoint(const checkpoint::CommitInfo& commit) override;
  void OnCheckpointFailed(checkpoint::CheckpointKind kind, const Status& why) override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Labels job_;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* data_wait_ = nullptr;
  struct GpuSeries {
    prometheus::Gauge* utilization = nullptr;
    prometheus::Gauge* memory_used = nullptr;
    prometheus::Gauge* memory_total = nullptr;
  };
  std::optional<GpuSeries> gpu_;  // registered with the first GPU sample
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* skipped_steps_ = nullptr;
  prometheus::Gauge* step_ = nullptr;
  prometheus::Gauge* tokens_per_second_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* learning_rate_ = nullptr;
  prometheus::Gauge* grad_norm_ = nullptr;
  prometheus::Gauge* micro_batch_ = nullptr;
  prometheus::Gauge* gradient_bytes_ = nullptr;
  prometheus::Gauge* generation_ = nullptr;
  prometheus::Gauge* rank_ = nullptr;
  prometheus::Gauge* world_size_ = nullptr;
  struct CheckpointSeries {
    prometheus::Histogram* duration = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* count = nullptr;
    prometheus::Counter* failures = nullptr;
  };
  std::map<checkpoint::CheckpointKind, CheckpointSeries> checkpoints_;
  // Mixture of experts, registered with the first step that routed tokens.
  prometheus::Family<prometheus::Gauge>* expert_tokens_ = nullptr;
  prometheus::Family<prometheus::Gauge>* moe_imbalance_ = nullptr;
};

}  // namespace tidal::worker
