// worker/checkpoint/trainer_checkpoint.h — saving and resuming a Trainer through the
// checkpoint format (manifest.h) and commit protocol (repository.h) on any ObjectStore.
//
// Save (collective): at the step boundary each rank copies its 1/W of every block's trainable flat
// (the same split at every ZeRO stage) into per-parameter pieces — the LoRA weights, and for a full
// checkpoint AdamW's two moments — to host memory; the shard is then built and written (by a
// background thread in the hooks, so training goes on; rank 0 also writes trainer_state.json); once
// every rank's write is done — checked over `comm` at later step boundaries — rank 0 gathers the
// shard entries, commits (manifest, then latest) and prunes. A failure anywhere fails the save
// on every rank and commits nothing.
//
// Resume (collective): rank 0 picks the newest usable checkpoint and broadcasts its step;
// each rank reads only the element ranges it holds (any world size, any stage), verifying
// chunk checksums; a DataLoss on any rank makes every rank fall back to the previous one.
// A snapshot (no optimizer state) resumes with fresh AdamW moments, and says so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/checkpoint_interval.h"
#include "common/status.h"
#include "worker/checkpoint/repository.h"
#include "worker/engine/run.h"
#include "worker/objstore/memory_store.h"
#include "worker/objstore/object_store.h"

namespace tidal::checkpoint {

// One committed checkpoint, as every rank sees it.
struct CommitInfo {
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  std::string uri;           // the step's directory
  double seconds = 0;        // from the copy at the step boundary to the commit
  uint64_t shard_bytes = 0;  // this rank's shard file
};

// What a resume from a store found (every rank's, rank 0's complete).
struct ResumeReport {
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  std::string uri;  // the step's directory
  // The newer checkpoints it skipped as corrupt, "step-…: why" (rank 0's scan, and the loads
  // that failed on some rank). A torn save, never committed, is not corrupt.
  std::vector<std::string> corrupt;
};

struct CheckpointPolicy {
  std::string uri;         // where checkpoints go (file://, s3://); "" saves none
  std::string resume_uri;  // resume from the newest usable checkpoint there (required)
  int64_t full_every = 0;  // steps between full checkpoints; 0: none but the final one
  // spec.checkpoint.fullEverySteps auto (full_every is then unused): the interval planned by
  // api::PlanCheckpointInterval from rank 0's measurements — the training time its full
  // checkpoints cost, its step time — the job's training time and `failures`, at the start of
  // each generation and after each periodic full checkpoint. Rank 0's plan is every rank's (one
  // collective per plan), so all ranks checkpoint at the same steps.
  std::optional<api::AutoIntervalSpec> auto_full;
  int64_t failures = 0;  // the job's restarts before this generation
  // The operator's generation of these ranks: the fencing token of every commit (repository.h).
  // Rank 0 raises the store's fence to it once resumed, before the first step, so a generation
  // this one replaces can commit nothing more; a newer fence fails this generation's start.
  // 0: unfenced (a run outside the operator).
  int64_t generation = 0;
  // The job these checkpoints belong to (Repository::Claim, before anything is resumed); no UID:
  // a run outside the operator, which claims nothing.
  StoreOwner owner;
  // spec.checkpoint.resumeFrom: another store to start from when `uri` holds no usable
  // checkpoint (required then to hold one); read, never written or claimed.
  std::string start_from_uri;
  // Called on every rank with each plan agreed and rank 0's inputs to it.
  std::function<void(const api::IntervalInputs& in, const api::IntervalPlan& plan)> on_interval;
  int64_t snapshot_every = 0;  // steps between snapshots; 0: none
  int keep = 3;                // newest full checkpoints kept
  bool resume = true;      // without resume_uri: resume from the newest usable one in `uri`, if any
  bool save_final = true;  // a full checkpoint after the last step
  bool export_final = true;  // and its adapter in PEFT's layout under <uri>/final/
  bool async = true;         // write in the background, commit at a later step boundary
  // Called on every rank after each commit.
  std::function<void(const CommitInfo& commit)> on_commit;
  // Called on every rank once a generation has resumed from a store checkpoint (its own, or
  // start_from_uri's); not for a resume from the peers' memory or a start at step 0.
  std::function<void(const ResumeReport& resumed)> on_resume;
  // Called on every rank for a save that was not committed (the error is then returned too).
  std::function<void(CheckpointKind kind, const Status& why)> on_failure;
  // The live tier (DESIGN.md §4 step 5). `live_store`: this rank's memory, where CheckpointLive
  // saves (not owned; null: none). `peer_resume`: the previous generation's ranks' memory
  // (worker/control/peer_store.h), holding its checkpoint of `peer_resume_step`. With a step
  // (> 0) every rank tries it first (one without `peer_resume` fails its part, so all of them
  // agree), the store's newest checkpoint being the fallback.
  objstore::MemoryStore* live_store = nullptr;
  std::shared_ptr<objstore::ObjectStore> peer_resume;
  int64_t peer_resume_step = 0;
};

// What must match between the run that saved and the run that resumes (model, LoRA, data,
// global batch, seed): a hash of those fields of the config.
std::string ConfigHash(const engine::TrainConfig& config);

StatusOr<std::unique_ptr<engine::TrainingHooks>> MakeCheckpointHooks(
    CheckpointPolicy policy, const objstore::S3Options& s3 = {});

// The collective operations themselves (used by the hooks; public for tests and tools).
// Returns the committed checkpoint's directory URI; `shard_bytes`, when given, gets the size of
// this rank's shard.
StatusOr<std::string> SaveCheckpoint(engine::Trainer& trainer, Repository& repo,
                                     CheckpointKind kind, int keep,
                                     uint64_t* shard_bytes = nullptr);
// Collective: a full checkpoint of this step, each rank's shard into its own `memory` (emptied
// first) and rank 0's manifest and trainer state into its own; nothing durable. The next
// generation reads it through the peers (ResumeFromPeers). Returns the step's URI in `memory`.
StatusOr<std::string> SaveToPeers(engine::Trainer& trainer, objstore::MemoryStore& memory);
// A buddy copy of this step (DESIGN.md §4 step 5), with no collective: this rank's pieces are
// copied to host memory now (the training thread's whole cost); the returned function, on any
// thread, builds this rank's shard and writes it into `memory` (rank 0 also the trainer state),
// then "<step>/part-<k+1>-of-<W>.json", the shard's manifest entries: the part is whole once
// that is there. Nothing in `memory` is removed (the caller prunes). ResumeFromPeers assembles
// the step's manifest from the W parts. The function returns the shard's bytes.
StatusOr<std::function<StatusOr<uint64_t>()>> CaptureBuddyCopy(engine::Trainer& trainer,
                                                               objstore::MemoryStore& memory);
// "part-00002-of-00004.json": rank 1's part of a buddy copy at world size 4.
std::string BuddyPartName(int rank, int world_size);
// Collective: loads `step` from `peers` (any world size, as from a store; null: this rank
// cannot reach them, and fails its part); an error on any rank is the error of every rank,
// and the trainer then holds partly read values. A step without a manifest (buddy copies) has
// it assembled from its parts.
Status ResumeFromPeers(engine::Trainer& trainer, objstore::ObjectStore* peers, int64_t step);
// The step resumed from; NotFound (on every rank) when the store holds no usable checkpoint.
StatusOr<int64_t> ResumeFromNewest(engine::Trainer& trainer, Repository& repo,
                                   ResumeReport* report = nullptr);

}  // namespace tidal::checkpoint
