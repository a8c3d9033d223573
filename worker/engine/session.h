// worker/engine/session.h — one generation of an elastic run: this rank's membership of a
// process group and the trainer built on it. The one way a rank starts: tidal-worker's control
// runtime and tidal-train's local loop (RunRank) both drive a Session. No LibTorch types, so the
// worker's control code (gRPC, state machine) stays out of LibTorch's headers. A rescale or a
// recovery moves the session to the new membership (Regroup: the engine stays, only the process
// group and the shard boundaries change) or, in a new process, starts one (Join); training state
// crosses over through a checkpoint: a live one in the ranks' memory for a rescale, a buddy's
// copy or the store's for a recovery.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/train_config.h"
#include "common/status.h"
#include "worker/engine/row_source.h"
#include "worker/engine/run.h"
#include "worker/engine/step_record.h"

namespace tidal::engine {

struct Membership {
  int64_t generation = 0;
  int rank = 0;
  int world_size = 1;
  std::string store_host = "127.0.0.1";  // the c10d TCPStore; rank 0 hosts it there
  int store_port = 0;
  std::string interface_host = "127.0.0.1";  // the address gloo binds this rank's pairs to
  // Bound on joining and on any one collective: a silent (hung) peer fails the session
  // within it; a dead one is usually seen at once as a closed connection.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // Bound on the wait, once a rank's engine is ready, for every other rank's: a rank that
  // joins loads its base weights while one that stays has kept them (Regroup).
  std::chrono::milliseconds ready_timeout{std::chrono::minutes(30)};
  // Rank 0 hosts the rendezvous store (a pod's worker); false where the launcher already
  // hosts it (tidal-train's local ranks).
  bool rank0_hosts_store = true;
  // The job's restarts before this generation (the operator's count): the failures the
  // automatic checkpoint interval estimates the MTBF from. The engine itself ignores it.
  int64_t job_restarts = 0;
};

struct SessionOptions {
  // Where the rows come from (worker/data/provider.h: tidal-prep's token store through the
  // prefetching loader). Rank 0 prepares while the others wait; then every rank opens.
  std::shared_ptr<DataProvider> data;
  std::optional<int64_t> max_steps;  // overrides spec.optimization.maxSteps
  int intra_op_threads = 0;          // 0: every core of the machine
  int cuda_device = 0;               // the GPU this rank trains on, when CUDA is available
  // The most host memory a read ahead may hold (TrainerOptions::read_ahead_max_bytes); -1: none
  // of its own.
  int64_t read_ahead_max_bytes = -1;
};

// What a local run reports at its end (tidal-train --out).
struct RunSummary {
  std::vector<double> losses;
  double train_seconds = 0;
  uint64_t base_checksum_before = 0;
};

class Session {
 public:
  // Rank 0 starts the store on store_host:store_port, then every rank joins the group and
  // builds its trainer at step 0. Resuming is the hooks' job (OnStart).
  static StatusOr<std::unique_ptr<Session>> Join(const TrainConfig& config,
                                                 const Membership& membership,
                                                 const SessionOptions& options);
  // The engine built ahead of its generation, in no process group: the rank and world size
  // planned for it (`planned`; the store fields are not used). It loads what Join would, the
  // base weights that rank will hold included, while the group of that generation does not
  // exist yet: a new pod prepares while the old generation trains (make before break). The
  // generation is then entered by Regroup, which re-cuts the shard where the rank or world
  // size turned out otherwise.
  static StatusOr<std::unique_ptr<Session>> Prepare(const TrainConfig& config,
                                                    const Membership& planned,
                                                    const SessionOptions& options);
  virtual ~Session() = default;

  // The engine kept across generations: this rank leaves the ended generation's process group
  // and joins `next`'s, keeping its process, model, data and the base weights it still holds
  // (worker/engine/trainer.h: JoinGroup); the ranks that join fresh (Join) and the ones that
  // regroup take part in the same collectives, so a generation may mix both. Afterwards the
  // session is at step 0 with initial adapters, as Join leaves it: resuming is the hooks' job.
  // On failure, usable() says whether a later Regroup may still be tried.
  virtual Status Regroup(const Membership& next, const SessionOptions& options) = 0;
  // While a generation trains, from a thread other than the one that steps: the base weights
  // this rank will hold at `planned` (rank, world size) and does not hold now are read into
  // memory for the next Regroup (Trainer::ReadAhead). It must have returned before the session
  // leaves the generation. Stops once `cancelled` says so, keeping what it read; `complete`
  // says whether it read everything.
  virtual Status ReadAhead(const Membership& planned, const std::function<bool()>& cancelled,
                           bool* complete) = 0;
  virtual bool usable() const = 0;

  virtual const Membership& membership() const = 0;
  virtual int64_t step() const = 0;
  virtual int64_t max_steps() const = 0;

  // One optimizer step (collective). LibTorch's and the backend's exceptions come back as a
  // Status naming the rank.
  virtual StatusOr<StepRecord> Step() = 0;
  // Collective: the bitwise OR of every rank's `flags` (bits 0..15) and, when any is set, the
  // largest `id` (the name of the request behind them; 0: none). The step-boundary agreement
  // behind checkpoint barriers, pauses and stops.
  struct Agreement {
    uint32_t flags = 0;
    uint64_t id = 0;
  };
  virtual StatusOr<Agreement> AgreeFlags(uint32_t flags, uint64_t id) = 0;

  // The hooks' calls, each collective and guarded like Step.
  virtual Status Start(TrainingHooks& hooks) = 0;   // OnStart: resume
  virtual Status After(TrainingHooks& hooks) = 0;   // AfterStep: scheduled saves
  virtual Status Finish(TrainingHooks& hooks) = 0;  // OnFinish: final save and export
  virtual StatusOr<std::string> CheckpointNow(TrainingHooks& hooks) = 0;
  virtual StatusOr<std::string> CheckpointLive(TrainingHooks& hooks) = 0;  // into host memory
  // A buddy copy: captured now, written by the returned function on any thread.
  virtual StatusOr<std::function<StatusOr<uint64_t>()>> CheckpointBuddy(TrainingHooks& hooks) = 0;

  // A hash of this rank's frozen base weights: equal before and after training when the base
  // is untouched bit for bit.
  virtual uint64_t FrozenChecksum() const = 0;
  // Collective: writes <out_dir>/rank-<r>.json (the run, memory, the checksums) and, on rank
  // 0, <out_dir>/lora_weights.safetensors with the trained adapter.
  virtual Status WriteSummary(const RunSummary& run, const std::string& out_dir) = 0;
};

}  // namespace tidal::engine
