// worker/checkpoint/trainer_checkpoint_internal.h — what trainer_checkpoint.cc shares with
// checkpoint_hooks.cc and buddy_copy.cc: the three phases of a save and the shard's JSON form.
// Not for other code.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/engine/trainer.h"

namespace tidal::checkpoint::internal {

// Phase 1, on the training thread at the step boundary: this rank's pieces copied to host
// memory (the only part that must stop training).
struct SaveCapture {
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  int rank = 0, world_size = 1, zero_stage = 0;
  std::string config_hash;
  std::chrono::steady_clock::time_point start;
  std::vector<torch::Tensor> tensors;  // own the bytes `pieces` point into (their storage)
  std::vector<PieceData> pieces;
  std::optional<nlohmann::json> trainer_state;  // rank 0 only
};

StatusOr<SaveCapture> CaptureForSave(engine::Trainer& trainer, CheckpointKind kind);
// Phase 2, on any thread: the shard built and written, durable on return.
StatusOr<BuiltShard> WriteCapture(Repository& repo, const SaveCapture& c);
// Phase 3, collective, on the training thread: every rank's write succeeded, or nothing is
// committed; rank 0 gathers the shard entries, commits (manifest, then latest) and prunes.
// `spread`: every rank's shard went to a store of its own (SaveToPeers): rank 0 writes the
// manifest only (Repository::CommitSpread) and prunes nothing.
Status CommitSave(engine::Trainer& trainer, Repository& repo, const SaveCapture& c,
                  const StatusOr<BuiltShard>& shard, int keep, bool spread = false);

// Every rank learns whether every rank succeeded (a failed rank still takes part).
Status AgreeOk(engine::Comm& comm, const Status& mine, const std::string& what);
// The trainer's state, the moments and residuals of step `step` of `repo`, read into `trainer`.
Status LoadStep(engine::Trainer& trainer, Repository& repo, int64_t step);
std::string NowRfc3339();
nlohmann::json ShardJson(const BuiltShard& shard);
BuiltShard ShardFromJson(const nlohmann::json& j);

}  // namespace tidal::checkpoint::internal
