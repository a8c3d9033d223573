// worker/engine/run.h — the engine's entry point for one rank, without LibTorch types, so
// that launchers and services outside worker/engine never include LibTorch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "worker/engine/train_config.h"

namespace tidal::engine {

struct RankLaunch {
  int rank = 0;
  int world_size = 1;
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  std::optional<int64_t> max_steps;  // overrides spec.optimization.maxSteps
  std::string out_dir;               // per-rank summary and the trained adapter weights
  int intra_op_threads = 0;          // 0: cores / world size
};

// Trains to the last step. Rank 0 prints one JSON line per optimizer step on stdout:
// {"step","loss","lr","grad_norm","tokens_per_s","world_size"}; logs go to stderr.
Status RunRank(const TrainConfig& config, const RankLaunch& launch);

}  // namespace tidal::engine
