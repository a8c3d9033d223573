// contract/worker_api.h — what the operator asks of one worker (worker.proto's WorkerControl
// service), as an interface over plain types (worker_status.h). WorkerClient (client.h) is the
// gRPC one; the controller gets its workers through a WorkerConnector, so its loop runs against
// in-process fakes in tests (tests/integration/controller/controller_loop_test.cc) as against
// real workers. No gRPC and no protobuf here: the messages are the protocol's, the transport is
// the client's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "contract/worker_status.h"

namespace tidal::contract {

struct ClientOptions {
  std::string address;          // HOST:PORT
  std::string token;            // "" sends no authorization metadata (for tests of the refusal)
  std::string tls_ca_pem;       // set: TLS, the server's certificate verified against it
  std::string tls_server_name;  // overrides the name checked in the certificate
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};  // per call
  // Transport settings for a process that holds thousands of these channels (the operator:
  // small messages, many workers): small read buffers and flow-control windows, no channelz
  // trace, no retry buffers. Off (gRPC's defaults) for a worker reading a peer's state in 1 MB
  // chunks, which 16 KB windows would stall. bench/worker_follow_memory_bench.cc measures both.
  bool lean_transport = false;
};

// A WatchStatus stream, open until its handle goes: destroying it cancels the stream and
// returns once its on_end has run.
class StatusStream {
 public:
  virtual ~StatusStream() = default;
  virtual bool ended() const = 0;
};

class WorkerApi {
 public:
  virtual ~WorkerApi() = default;

  virtual StatusOr<WorkerStatus> GetStatus() = 0;
  // The engine built ahead of generation `generation` for this rank and world size.
  virtual Status PrepareEngine(int64_t generation, int world_size, int rank) = 0;
  // `state_peers` and `state_step`: the previous generation's live checkpoint; `members` and
  // `ward`: buddy copies (none without members); `restarts`: the job's so far (the automatic
  // checkpoint interval's failure count).
  virtual Status Rendezvous(int64_t generation, int world_size, int rank,
                            const std::string& store_address,
                            const std::vector<std::string>& state_peers, int64_t state_step,
                            const std::vector<std::string>& members, int ward,
                            int64_t restarts) = 0;
  // `barrier_id`: the barrier the call belongs to (0: unnamed). `live`: kept in the ranks'
  // memory for the next generation, not written to the store.
  virtual StatusOr<CheckpointInfo> Checkpoint(bool pause, std::chrono::milliseconds timeout,
                                              uint64_t barrier_id, bool live) = 0;
  virtual Status Resume() = 0;
  virtual Status Shutdown(const std::string& reason) = 0;
  // `on_status` gets the worker's status at once, then on every change the operator acts on,
  // step figures at most every `min_interval`, a heartbeat otherwise; `on_end` once, with why
  // the stream ended (OK: the worker exited). Both run on the transport's threads, never
  // inside this call, and must not block.
  virtual std::unique_ptr<StatusStream> WatchStatus(
      std::chrono::milliseconds min_interval, std::chrono::milliseconds heartbeat,
      std::function<void(const WorkerStatus&)> on_status,
      std::function<void(const Status&)> on_end) = 0;
};

// How the controller reaches a worker: the gRPC client unless a test says otherwise.
using WorkerConnector = std::function<std::shared_ptr<WorkerApi>(const ClientOptions&)>;

}  // namespace tidal::contract
