// worker/checkpoint/repository.h — the commit protocol of DESIGN.md §5 over an ObjectStore,
// without LibTorch. Saving: every rank writes its shard (durable on return), rank 0 writes
// trainer_state.json; after a barrier that says every shard is durable, rank 0 commits by
// writing manifest.json, then `latest`. A checkpoint without a manifest was never committed
// (torn) and is ignored; `latest` is a hint for humans and tools, the scan is the truth.
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

struct ScannedCheckpoint {
  int64_t step = 0;
  std::optional<Manifest> manifest;  // set when the checkpoint is committed and whole
  std::string problem;               // why it is not usable, when it is not
};

class Repository {
 public:
  explicit Repository(objstore::ObjectStore& store) : store_(store) {}
  objstore::ObjectStore& store() { return store_; }

  Status WriteShard(int64_t step, const BuiltShard& shard);
  Status WriteTrainerState(int64_t step, const nlohmann::json& state);
  // The manifest, then `latest`. Refuses a manifest whose shards are not all in the store with
  // their sizes (a rank's write was lost), so a commit never points at missing data.
  Status Commit(const Manifest& manifest);
  // The manifest alone, for a checkpoint whose shards sit in other stores (the peer tier: each
  // rank's shard in its own memory, worker/control/peer_store.h), so they cannot be listed
  // here: the ranks agreed over their process group that every write succeeded. No `latest`.
  Status CommitSpread(const Manifest& manifest);

  // Every step directory, newest first, checked as described above.
  StatusOr<std::vector<ScannedCheckpoint>> Scan();
  // The newest usable checkpoint not in `exclude` (steps already found corrupt), or NotFound.
  // Skipped ones are logged with their problem.
  StatusOr<Manifest> NewestUsable(const std::set<int64_t>& exclude = {});

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
};

}  // namespace tidal::checkpoint
