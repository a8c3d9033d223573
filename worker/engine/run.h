// worker/engine/run.h — the engine's entry point for one rank, without LibTorch types, so
// that launchers and services outside worker/engine never include LibTorch headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "api/train_config.h"
#include "common/status.h"
#include "worker/engine/row_source.h"

namespace tidal::engine {

class Trainer;

// Called by RunRank on the rank's thread around training (checkpoints live outside the
// engine: worker/checkpoint implements these). Every rank calls every hook, so hooks may run
// collectives.
class TrainingHooks {
 public:
  virtual ~TrainingHooks() = default;
  // Before the first step (e.g. resume from a checkpoint).
  virtual Status OnStart(Trainer& trainer) = 0;
  // After each optimizer step (e.g. save a checkpoint).
  virtual Status AfterStep(Trainer& trainer) = 0;
  // After the last step, before the summary.
  virtual Status OnFinish(Trainer& trainer) = 0;
  // A full checkpoint at this step boundary, committed before it returns (a save still in
  // flight is committed first): the barrier of a rescale. Returns the committed step's
  // directory URI.
  virtual StatusOr<std::string> CheckpointNow(Trainer& trainer) = 0;
  // The barrier of a live rescale: a full checkpoint at this step boundary kept in the ranks'
  // host memory for the next generation to read from them, none written to the store.
  // Returns the step's URI there.
  virtual StatusOr<std::string> CheckpointLive(Trainer& trainer) {
    (void)trainer;
    return FailedPrecondition("these training hooks keep no live checkpoints");
  }
  // A buddy copy: this step's full state copied to host memory now; the returned function (run
  // on any thread, no collective) keeps this rank's part in its own memory (with the older
  // copies there) for a peer to copy and for the next generation to read after a loss, and
  // returns its bytes.
  virtual StatusOr<std::function<StatusOr<uint64_t>()>> CheckpointBuddy(Trainer& trainer) {
    (void)trainer;
    return FailedPrecondition("these training hooks keep no buddy copies");
  }
};

struct RankLaunch {
  int rank = 0;
  int world_size = 1;
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  std::optional<int64_t> max_steps;    // overrides spec.optimization.maxSteps
  std::string out_dir;                 // per-rank summary and the trained adapter weights
  int intra_op_threads = 0;            // 0: cores / world size
  TrainingHooks* hooks = nullptr;      // not owned; null for none
  std::shared_ptr<DataProvider> data;  // the rows (worker/data/provider.h implements it)
};

// Trains to the last step. Rank 0 prints one JSON line per optimizer step on stdout:
// {"step","loss","lr","grad_norm","tokens_per_s","world_size"}; logs go to stderr.
Status RunRank(const TrainConfig& config, const RankLaunch& launch);

}  // namespace tidal::engine
