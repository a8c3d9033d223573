// worker/control/peer_store.h — the previous generation's live checkpoint, read from its ranks'
// memory over the control API (ReadState, with the job token): an ObjectStore, so the
// checkpoint loader reads exactly the ranges a rank of the new world size needs, as it would
// from the store (DESIGN.md §4 step 5). Rank k of the old generation holds
// "<step>/shard-<k+1>-of-<W>.safetensors"; rank 0 also holds the manifest and trainer state.
// Read-only: Put, Delete and List are refused (the Rendezvous names the step). No LibTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "contract/client.h"
#include "worker/objstore/object_store.h"

namespace tidal::worker {

class PeerStore final : public objstore::ObjectStore {
 public:
  // `peers`: the old ranks' control addresses (HOST:PORT) in rank order; `client`: the token,
  // TLS and per-call timeout (its address is ignored).
  PeerStore(std::vector<std::string> peers, const contract::ClientOptions& client);

  std::string uri() const override;
  Status Put(const std::string& key, std::string_view data) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  StatusOr<uint64_t> Size(const std::string& key) override;
  StatusOr<std::vector<objstore::ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::vector<std::string>& keys) override;

  // The rank whose memory holds `key`: k for a shard "…/shard-<k+1>-of-<W>.safetensors" or a
  // buddy copy's part "…/part-<k+1>-of-<W>.json" (W must be the number of peers), else 0.
  StatusOr<size_t> Owner(const std::string& key) const;

 private:
  std::vector<std::string> peers_;
  std::vector<std::unique_ptr<contract::WorkerClient>> clients_;
};

}  // namespace tidal::worker
