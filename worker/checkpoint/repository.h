// worker/checkpoint/repository.h — the commit protocol of DESIGN.md §5 over an ObjectStore,
// without LibTorch. Saving: every rank writes its shard (durable on return), rank 0 writes
// trainer_state.json; after a barrier that says every shard is durable, rank 0 commits by
// writing manifest.json, then `latest`. A checkpoint without a manifest was never committed
// (torn) and is ignored; `latest` is a hint for humans and tools, the scan is the truth.
// Fencing (as a lease's fencing token): every commit of the operator's workers carries their
// generation, and `fence` holds the newest generation that started or committed. A commit from
// an older generation is refused (FailedPrecondition, "superseded"), so a generation the operator
// has replaced — a worker it could not reach, still training — never writes beside its successor
// or moves `latest`. The check and the raise are a read then a write: two generations racing
// within that window are not caught here (object stores offer no compare-and-swap on file://),
// which is why a new generation raises the fence when it starts, long before it commits.
// Loading: scan newest first; a checkpoint whose manifest does not parse or whose shards are
// missing or of the wrong size is skipped with the reason; chunk checksums are verified as
// ranges are read (a mismatch is DataLoss, and the caller falls back to an older one).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/checkpoint/manifest.h"
#include "worker/objstore/object_store.h"

namespace tidal::checkpoint {

// The job a store belongs to (its `owner` object). A job's checkpoints are its own: a job of
// the same name made again (deleted and re-applied) is another job, with another UID.
struct StoreOwner {
  std::string uid, namespace_, name;
};

struct ScannedCheckpoint {
  int64_t step = 0;
  std::optional<Manifest> manifest;  // set when the checkpoint is committed and whole
  std::string problem;               // why it is not usable, when it is not
};

class Repository {
 public:
  explicit Repository(objstore::ObjectStore& store) : store_(store) {}
  objstore::ObjectStore& store() { return store_; }

  // The generation this repository commits for (0, the default: unfenced; a run outside the
  // operator). Commit stamps it into the manifest and checks the fence first.
  void SetGeneration(int64_t generation) { generation_ = generation; }
  int64_t generation() const { return generation_; }
  // Claims the store for `owner`: one without an owner is claimed (a new job's; or one written
  // before owners were recorded, which its job keeps); the owner's own is fine; another job's is
  // FailedPrecondition naming both and what to do, so a job never resumes or overwrites the
  // checkpoints of another. An owner without a UID claims nothing (a run outside the operator).
  Status Claim(const StoreOwner& owner);
  // The newest generation that started or committed (0 when none did).
  StatusOr<int64_t> ReadFence();
  // Raises the fence to this repository's generation; FailedPrecondition naming both
  // generations when a newer one holds it (this one is superseded). A no-op when unfenced.
  Status Fence();

  Status WriteShard(int64_t step, const BuiltShard& shard);
  Status WriteTrainerState(int64_t step, const nlohmann::json& state);
  // The manifest, then `latest`. Refuses a manifest whose shards are not all in the store with
  // their sizes (a rank's write was lost), so a commit never points at missing data, and a
  // commit of a superseded generation (Fence).
  Status Commit(const Manifest& manifest);
  // The manifest alone, for a checkpoint whose shards sit in other stores (the peer tier: each
  // rank's shard in its own memory, worker/control/peer_store.h), so they cannot be listed
  // here: the ranks agreed over their process group that every write succeeded. No `latest`.
  Status CommitSpread(const Manifest& manifest);

  // Every step directory, newest first, checked as described above.
  StatusOr<std::vector<ScannedCheckpoint>> Scan();
  // The newest usable checkpoint not in `exclude` (steps already found corrupt), or NotFound.
  // Skipped ones are logged with their problem; those that were committed but are not whole
  // (a manifest that does not parse, a shard missing or short: corruption; not a torn save that
  // was never committed, nor a manifest the store failed to serve) are added to `corrupt` as
  // "step-…: why", when given.
  StatusOr<Manifest> NewestUsable(const std::set<int64_t>& exclude = {},
                                  std::vector<std::string>* corrupt = nullptr);
  // Points `latest` at `step` (a resume that skipped newer, corrupt checkpoints: `latest` named
  // one of them until the next commit).
  Status PointLatestAt(int64_t step);

  // Elements [first, first + count) of `tensor` as raw little-endian bytes, verified.
  StatusOr<std::string> ReadTensor(const Manifest& manifest, const std::string& tensor,
                                   int64_t first, int64_t count);
  // The same into `dest` (count × dtype size bytes). On error `dest` holds unverified bytes.
  Status ReadTensorInto(const Manifest& manifest, const std::string& tensor, int64_t first,
                        int64_t count, char* dest);
  struct TensorRead {
    std::string tensor;
    int64_t first = 0, count = 0;
    char* dest = nullptr;
  };
  // Many ReadTensorInto at once (a rank resuming reads a slice of every tensor): the ranges
  // of one shard file are joined into requests of up to 1 MiB (reading and dropping gaps of up
  // to 256 KiB between them), `parallel` requests in flight. Only wanted chunks are verified.
  // The first error is returned, DataLoss before others.
  Status ReadTensorsInto(const Manifest& manifest, const std::vector<TensorRead>& reads,
                         int parallel = 2);
  StatusOr<nlohmann::json> ReadTrainerState(int64_t step);
  // The committed manifest of `step` (NotFound when it was never committed).
  StatusOr<Manifest> ReadManifest(int64_t step);

  // Deletes what the retention policy drops (StepsToPrune with `keep`) and torn directories
  // older than the newest committed checkpoint. Returns the steps deleted.
  StatusOr<std::vector<int64_t>> Prune(int keep);

 private:
  Status DeleteStep(int64_t step);
  objstore::ObjectStore& store_;
  int64_t generation_ = 0;
};

}  // namespace tidal::checkpoint
