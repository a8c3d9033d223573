// contract/client.cc
#include "contract/client.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <optional>

#include "contract/wire.h"
#include "tidal/worker/v1/worker.grpc.pb.h"

namespace tidal::contract {
namespace {

namespace pb = ::tidal::worker::v1;

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    default:
      return "UNKNOWN";
  }
}

Status FromGrpcStatus(const grpc::Status& s) {
  return FromGrpc(static_cast<int>(s.error_code()), s.error_message());
}

}  // namespace

Status FromGrpc(int grpc_code, const std::string& message) {
  const auto code = static_cast<grpc::StatusCode>(grpc_code);
  if (code == grpc::StatusCode::OK) return OkStatus();
  std::string text = std::string(GrpcCodeName(code)) + ": " + message;
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return InvalidArgument(text);
    case grpc::StatusCode::NOT_FOUND:
      return NotFound(text);
    case grpc::StatusCode::ALREADY_EXISTS:
      return AlreadyExists(text);
    case grpc::StatusCode::FAILED_PRECONDITION:
      return FailedPrecondition(text);
    case grpc::StatusCode::UNAUTHENTICATED:
      return Unauthenticated(text);
    case grpc::StatusCode::PERMISSION_DENIED:
      return PermissionDenied(text);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return DeadlineExceeded(text);
    case grpc::StatusCode::ABORTED:
      return Aborted(text);
    case grpc::StatusCode::DATA_LOSS:
      return DataLoss(text);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      return Unavailable(text);
    default:
      return Internal(text);
  }
}

struct WorkerClient::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  std::mutex mu;
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<pb::WorkerControl::Stub> stub;

  void Connect() {  // under mu
    channel = grpc::CreateCustomChannel(options.address, credentials, args);
    stub = pb::WorkerControl::NewStub(channel);
  }
  // The stub for the next call. A channel in TRANSIENT_FAILURE (the worker was not listening
  // yet, or restarted) is replaced: gRPC would otherwise fail every call until its reconnect
  // backoff ran out, which was measured at 30 s and more for a worker that had been up for
  // most of that time.
  std::shared_ptr<pb::WorkerControl::Stub> Stub() {
    std::lock_guard<std::mutex> lock(mu);
    if (channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE) Connect();
    return stub;
  }
  void Prepare(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) const {
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
  }
};

WorkerClient::WorkerClient(ClientOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.tls_ca_pem.empty()) {
    impl_->credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca_pem;
    impl_->credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty())
      impl_->args.SetSslTargetNameOverride(options.tls_server_name);
  }
  // Reconnect quickly after a worker restarts: the operator polls on its own schedule. A
  // channel of its own (not the process-wide subchannel pool), so that replacing it starts
  // afresh.
  impl_->args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl_->args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  impl_->args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (options.lean_transport) {
    impl_->args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
    impl_->args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    impl_->args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, 4096);
    impl_->args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1024);
    impl_->args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16384);
    impl_->args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16384);
    impl_->args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 16384);
    impl_->args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  }
  impl_->options = std::move(options);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->Connect();
}

WorkerClient::~WorkerClient() = default;

StatusOr<WorkerStatus> WorkerClient::GetStatus() {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::WorkerStatus out;
  grpc::Status s = impl_->Stub()->GetStatus(&ctx, pb::GetStatusRequest(), &out);
  if (!s.ok()) return FromGrpcStatus(s);
  return FromWire(out);
}

Status WorkerClient::PrepareEngine(int64_t generation, int world_size, int rank) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::PrepareEngineRequest req;
  req.set_generation(generation);
  req.set_world_size(world_size);
  req.set_rank(rank);
  pb::PrepareEngineResponse out;
  return FromGrpcStatus(impl_->Stub()->PrepareEngine(&ctx, req, &out));
}

Status WorkerClient::Rendezvous(int64_t generation, int world_size, int rank,
                                const std::string& store_address,
                                const std::vector<std::string>& state_peers, int64_t state_step,
                                const std::vector<std::string>& members, int ward,
                                int64_t restarts) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::RendezvousRequest req;
  req.set_generation(generation);
  req.set_world_size(world_size);
  req.set_rank(rank);
  req.set_store_address(store_address);
  for (const std::string& peer : state_peers) req.add_state_peers(peer);
  req.set_state_step(state_step);
  for (const std::string& member : members) req.add_members(member);
  req.set_ward(ward);
  req.set_restarts(restarts);
  pb::RendezvousResponse out;
  return FromGrpcStatus(impl_->Stub()->Rendezvous(&ctx, req, &out));
}

StatusOr<CheckpointInfo> WorkerClient::Checkpoint(bool pause, std::chrono::milliseconds timeout,
                                                  uint64_t barrier_id, bool live) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, timeout);
  pb::CheckpointRequest req;
  req.set_pause(pause);
  req.set_barrier_id(barrier_id);
  req.set_live(live);
  pb::CheckpointResponse out;
  grpc::Status s = impl_->Stub()->Checkpoint(&ctx, req, &out);
  if (!s.ok()) return FromGrpcStatus(s);
  return FromWire(out.checkpoint());
}

StatusOr<int64_t> WorkerClient::Pause(std::chrono::milliseconds timeout, uint64_t barrier_id) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, timeout);
  pb::PauseRequest req;
  req.set_barrier_id(barrier_id);
  pb::PauseResponse out;
  grpc::Status s = impl_->Stub()->Pause(&ctx, req, &out);
  if (!s.ok()) return FromGrpcStatus(s);
  return out.step();
}

Status WorkerClient::Resume() {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::ResumeResponse out;
  return FromGrpcStatus(impl_->Stub()->Resume(&ctx, pb::ResumeRequest(), &out));
}

Status WorkerClient::Shutdown(const std::string& reason) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::ShutdownRequest req;
  req.set_reason(reason);
  pb::ShutdownResponse out;
  return FromGrpcStatus(impl_->Stub()->Shutdown(&ctx, req, &out));
}

StatusOr<uint64_t> WorkerClient::ReadState(const std::string& key, uint64_t offset, uint64_t length,
                                           bool to_end, std::string* into) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout);
  pb::ReadStateRequest req;
  req.set_key(key);
  req.set_offset(offset);
  req.set_length(length);
  req.set_to_end(to_end);
  auto reader = impl_->Stub()->ReadState(&ctx, req);
  pb::StateChunk chunk;
  uint64_t size = 0;
  bool first = true;
  if (into) into->clear();
  while (reader->Read(&chunk)) {
    if (first) size = chunk.object_size();
    first = false;
    if (into) into->append(chunk.data());
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  if (first) return Unavailable("ReadState of \"" + key + "\": the stream ended without data");
  return size;
}

Status WorkerClient::WatchSteps(int64_t after_step, std::chrono::milliseconds timeout,
                                const std::function<bool(const StepEvent&)>& on_event) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, timeout);
  pb::WatchStepsRequest req;
  req.set_after_step(after_step);
  auto reader = impl_->Stub()->WatchSteps(&ctx, req);
  pb::StepEvent event;
  while (reader->Read(&event)) {
    if (!on_event(FromWire(event))) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return OkStatus();  // we stopped it
  return FromGrpcStatus(s);
}

namespace {

// One WatchStatus call: reads until the stream ends, then reports once. Owned by its handle,
// which cancels it and waits for the end before freeing it.
struct StatusReactor : grpc::ClientReadReactor<pb::WorkerStatus> {
  grpc::ClientContext ctx;
  pb::WatchStatusRequest request;
  pb::WorkerStatus message;
  std::shared_ptr<pb::WorkerControl::Stub> stub;  // kept while the call runs
  std::function<void(const WorkerStatus&)> on_status;
  std::function<void(const Status&)> on_end;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool done = false;

  // Set by the reader: why the stream ended though the worker did not end it (a status this
  // build cannot read); only the reactor's own callbacks touch it, one at a time.
  std::optional<Status> refused;

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ends: OnDone follows
    StatusOr<WorkerStatus> status = FromWire(message);
    if (!status.ok()) {  // a newer worker's phase: nothing may be decided on it, nor followed
      refused = status.status();
      ctx.TryCancel();
      return;
    }
    on_status(*status);
    StartRead(&message);
  }
  void OnDone(const grpc::Status& s) override {
    on_end(refused ? *refused : FromGrpcStatus(s));
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
};

class GrpcStatusStream : public StatusStream {
 public:
  explicit GrpcStatusStream(StatusReactor* reactor) : reactor_(reactor) {}
  ~GrpcStatusStream() override {
    reactor_->ctx.TryCancel();
    {
      std::unique_lock<std::mutex> lock(reactor_->mu);
      reactor_->cv.wait(lock, [&] { return reactor_->done; });
    }
    delete reactor_;
  }
  bool ended() const override {
    std::lock_guard<std::mutex> lock(reactor_->mu);
    return reactor_->done;
  }

 private:
  StatusReactor* reactor_;  // done once on_end has run; this waits for that
};

}  // namespace

std::unique_ptr<StatusStream> WorkerClient::WatchStatus(
    std::chrono::milliseconds min_interval, std::chrono::milliseconds heartbeat,
    std::function<void(const WorkerStatus&)> on_status, std::function<void(const Status&)> on_end) {
  auto* r = new StatusReactor();
  if (!impl_->options.token.empty())
    r->ctx.AddMetadata("authorization", "Bearer " + impl_->options.token);
  r->request.set_min_interval_ms(min_interval.count());
  r->request.set_heartbeat_ms(heartbeat.count());
  r->on_status = std::move(on_status);
  r->on_end = std::move(on_end);
  r->stub = impl_->Stub();
  r->stub->async()->WatchStatus(&r->ctx, &r->request, r);
  r->StartRead(&r->message);
  r->StartCall();
  return std::make_unique<GrpcStatusStream>(r);
}

}  // namespace tidal::contract
