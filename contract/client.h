// contract/client.h — the gRPC side of tidal.worker.v1 for the operator, the workers reading a
// peer's state, and tests: one channel per worker, the job token on every call, a deadline on
// every call, errors as Status, plain types in and out (the protobuf stays in client.cc).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "contract/worker_api.h"
#include "contract/worker_status.h"

namespace tidal::contract {

class WorkerClient : public WorkerApi {
 public:
  explicit WorkerClient(ClientOptions options);
  ~WorkerClient() override;

  StatusOr<WorkerStatus> GetStatus() override;
  // The engine built ahead of generation `generation` for this rank and world size (worker.proto).
  Status PrepareEngine(int64_t generation, int world_size, int rank) override;
  // `state_peers` and `state_step`: the previous generation's live checkpoint (worker.proto).
  // `members` and `ward`: buddy copies (worker.proto); none without members. `restarts`: the
  // job's so far.
  Status Rendezvous(int64_t generation, int world_size, int rank, const std::string& store_address,
                    const std::vector<std::string>& state_peers = {}, int64_t state_step = 0,
                    const std::vector<std::string>& members = {}, int ward = 0,
                    int64_t restarts = 0) override;
  // `barrier_id`: the barrier the call belongs to (worker.proto); 0: unnamed. `live`: kept in
  // the ranks' memory for the next generation, not written to the store.
  StatusOr<CheckpointInfo> Checkpoint(bool pause, std::chrono::milliseconds timeout,
                                      uint64_t barrier_id = 0, bool live = false) override;
  StatusOr<int64_t> Pause(std::chrono::milliseconds timeout, uint64_t barrier_id = 0);
  Status Resume() override;
  Status Shutdown(const std::string& reason) override;
  // Bytes [offset, offset + length) of `key` in the worker's peer state (to its end with
  // `to_end`), appended to `into` when given; returns the object's size.
  StatusOr<uint64_t> ReadState(const std::string& key, uint64_t offset, uint64_t length,
                               bool to_end, std::string* into);
  // Calls `on_event` for each step after `after_step` until it returns false, the stream
  // ends, or `timeout`.
  Status WatchSteps(int64_t after_step, std::chrono::milliseconds timeout,
                    const std::function<bool(const StepEvent&)>& on_event);

  // Opens a WatchStatus stream (worker.proto) on this client's channel, with no thread of its
  // own (gRPC's callback API). The stream has no deadline.
  std::unique_ptr<StatusStream> WatchStatus(std::chrono::milliseconds min_interval,
                                            std::chrono::milliseconds heartbeat,
                                            std::function<void(const WorkerStatus&)> on_status,
                                            std::function<void(const Status&)> on_end) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// gRPC's status as ours; the gRPC code's name leads the message ("UNAUTHENTICATED: ...").
Status FromGrpc(int grpc_code, const std::string& message);

}  // namespace tidal::contract
