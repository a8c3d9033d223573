// worker/control/service.cc — WorkerControl's handlers: authenticate, translate, delegate.
#include "worker/control/service.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "common/log.h"
#include "contract/wire.h"
#include "contract/worker_status.h"
#include "tidal/worker/v1/worker.grpc.pb.h"

namespace tidal::worker {
namespace {

namespace pb = ::tidal::worker::v1;
using Clock = std::chrono::steady_clock;

// A call without a deadline still ends: barriers wait at most this long.
constexpr auto kMaxWait = std::chrono::minutes(30);

grpc::Status ToGrpc(const Status& s) {
  using grpc::StatusCode;
  StatusCode code = StatusCode::UNKNOWN;
  switch (s.code()) {
    case tidal::StatusCode::kOk:
      return grpc::Status::OK;
    case tidal::StatusCode::kInvalidArgument:
      code = StatusCode::INVALID_ARGUMENT;
      break;
    case tidal::StatusCode::kNotFound:
      code = StatusCode::NOT_FOUND;
      break;
    case tidal::StatusCode::kFailedPrecondition:
      code = StatusCode::FAILED_PRECONDITION;
      break;
    case tidal::StatusCode::kUnavailable:
      code = StatusCode::UNAVAILABLE;
      break;
    case tidal::StatusCode::kDeadlineExceeded:
      code = StatusCode::DEADLINE_EXCEEDED;
      break;
    case tidal::StatusCode::kAborted:
      code = StatusCode::ABORTED;
      break;
    case tidal::StatusCode::kDataLoss:
      code = StatusCode::DATA_LOSS;
      break;
    case tidal::StatusCode::kInternal:
      code = StatusCode::INTERNAL;
      break;
    case tidal::StatusCode::kAlreadyExists:
      code = StatusCode::ALREADY_EXISTS;
      break;
    case tidal::StatusCode::kUnauthenticated:
      code = StatusCode::UNAUTHENTICATED;
      break;
    case tidal::StatusCode::kPermissionDenied:
      code = StatusCode::PERMISSION_DENIED;
      break;
    case tidal::StatusCode::kExpired:  // no gRPC kind of its own: the state moved on
      code = StatusCode::FAILED_PRECONDITION;
      break;
  }
  return grpc::Status(code, s.message());
}

constexpr size_t kRecentSteps = 64;

contract::StepEvent Reported(const StepEvent& e) {
  contract::StepEvent out;
  out.generation = e.generation;
  out.step = e.record.step;
  out.loss = e.record.loss;
  out.learning_rate = e.record.lr;
  out.grad_norm = e.record.grad_norm;
  out.tokens_per_second = e.record.tokens_per_s;
  out.seconds = e.record.seconds;
  out.world_size = e.record.world_size;
  out.unix_millis = e.unix_millis;
  out.skipped = e.record.skipped;
  out.data_wait_seconds = e.record.data_wait_seconds;
  if (e.gpu) out.gpu_utilization_percent = e.gpu->utilization_percent;
  return out;
}

contract::CheckpointInfo Reported(const CheckpointRef& c) {
  return {c.step, c.kind, c.uri, c.unix_millis};
}

Clock::time_point DeadlineOf(const grpc::ServerContext* ctx) {
  const auto limit = Clock::now() + kMaxWait;
  const auto remaining = ctx->deadline() - std::chrono::system_clock::now();
  if (remaining > kMaxWait) return limit;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(remaining);
}

class Service final : public pb::WorkerControl::Service {
 public:
  Service(WorkerRuntime& runtime, std::string token, std::function<void()> on_shutdown)
      : runtime_(runtime),
        expected_("Bearer " + std::move(token)),
        on_shutdown_(std::move(on_shutdown)),
        started_(Clock::now()) {}
  ~Service() override {
    if (shutdown_thread_.joinable()) shutdown_thread_.join();
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const pb::GetStatusRequest*,
                         pb::WorkerStatus* out) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    contract::ToWire(StatusNow(), out);
    return grpc::Status::OK;
  }

  grpc::Status WatchStatus(grpc::ServerContext* ctx, const pb::WatchStatusRequest* req,
                           grpc::ServerWriter<pb::WorkerStatus>* writer) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    using std::chrono::milliseconds;
    const milliseconds min_interval(req->min_interval_ms() == 0
                                        ? 1000
                                        : std::clamp<int64_t>(req->min_interval_ms(), 100, 60000));
    const milliseconds heartbeat(
        req->heartbeat_ms() == 0 ? 10000 : std::clamp<int64_t>(req->heartbeat_ms(), 1000, 300000));
    const std::vector<StepEvent> newest = runtime_.RecentEvents(1);
    uint64_t cursor = newest.empty() ? 0 : newest.back().seq;
    std::optional<contract::WorkerStatus> sent_actionable;
    int64_t sent_step = -1;
    std::optional<Clock::time_point> sent_at;
    while (!ctx->IsCancelled()) {
      const contract::WorkerStatus now = StatusNow();
      contract::WorkerStatus actionable = contract::ActionablePart(now);
      const auto t = Clock::now();
      const bool due = !sent_at || actionable != sent_actionable ||
                       (now.step != sent_step && t - *sent_at >= min_interval) ||
                       t - *sent_at >= heartbeat;
      if (due) {
        pb::WorkerStatus message;
        contract::ToWire(now, &message);
        if (!writer->Write(message)) return grpc::Status::OK;  // the caller went away
        sent_actionable = std::move(actionable);
        sent_step = now.step;
        sent_at = t;
      }
      if (runtime_.exited()) break;
      // A step wakes this at once; a change of phase announces itself to no one: looked at
      // every 100 ms (in-process, a copy of the state).
      const std::vector<StepEvent> events =
          runtime_.EventsAfter(cursor, 256, t + milliseconds(100));
      if (!events.empty()) cursor = events.back().seq;
    }
    return grpc::Status::OK;
  }

  contract::WorkerStatus StatusNow() const {
    const WorkerState s = runtime_.State();
    contract::WorkerStatus out;
    out.phase = s.phase;
    out.generation = s.generation;
    out.rank = s.rank;
    out.world_size = s.world_size;
    out.step = s.step;
    out.max_steps = s.max_steps;
    if (s.last_step) {
      out.loss = s.last_step->loss;
      out.tokens_per_second = s.last_step->tokens_per_s;
      out.learning_rate = s.last_step->lr;
      out.grad_norm = s.last_step->grad_norm;
    }
    if (s.gpu) {
      out.gpu_utilization_percent = s.gpu->utilization_percent;
      out.gpu_memory_used_bytes = s.gpu->memory_used_bytes;
    }
    for (const StepEvent& e : runtime_.RecentEvents(kRecentSteps))
      out.recent_steps.push_back(Reported(e));
    if (s.last_checkpoint) out.last_checkpoint = Reported(*s.last_checkpoint);
    if (s.live_checkpoint) out.live_checkpoint = Reported(*s.live_checkpoint);
    if (s.resumed_from) out.resumed_from = Reported(*s.resumed_from);
    out.skipped_checkpoints = s.skipped_checkpoints;
    for (const HeldPart& h : s.held)
      out.held_parts.push_back({h.generation, h.rank, h.world_size, h.step});
    out.last_error = s.last_error;
    out.last_error_permanent = s.last_error_permanent;
    if (s.prepared)
      out.prepared_engine =
          contract::PreparedEngine{s.prepared->generation, s.prepared->rank, s.prepared->world_size,
                                   s.prepared->ready, s.prepared->error};
    if (s.checkpoint_interval) {
      const api::IntervalInputs& in = s.checkpoint_interval->inputs;
      const api::IntervalPlan& plan = s.checkpoint_interval->plan;
      contract::CheckpointIntervalPlan c;
      c.full_every_steps = plan.steps;
      c.reason = api::ReasonName(plan.reason);
      c.cost_seconds = in.cost_seconds;
      c.step_seconds = in.step_seconds;
      c.mtbf_seconds = plan.mtbf_seconds;
      c.failures = in.failures;
      c.trained_seconds = in.trained_seconds;
      c.optimum_seconds = plan.optimum_seconds;
      c.expected_waste = plan.expected_waste;
      out.checkpoint_interval = c;
    }
    out.uptime_millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count();
    return out;
  }

  // A repeated HOST:PORT field into `out`; INVALID_ARGUMENT naming the first bad entry.
  static std::optional<grpc::Status> AddressList(
      const google::protobuf::RepeatedPtrField<std::string>& field, const std::string& name,
      std::vector<std::string>& out) {
    for (int i = 0; i < field.size(); ++i) {
      const std::string& address = field.Get(i);
      const auto colon = address.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 || !ParsePort(address.substr(colon + 1), &port))
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            name + "[" + std::to_string(i) + "]: expected HOST:PORT, got \"" + address + "\"");
      out.push_back(address);
    }
    return std::nullopt;
  }

  grpc::Status PrepareEngine(grpc::ServerContext* ctx, const pb::PrepareEngineRequest* req,
                             pb::PrepareEngineResponse*) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    engine::Membership planned;
    planned.generation = req->generation();
    planned.world_size = req->world_size();
    planned.rank = req->rank();
    return ToGrpc(runtime_.PrepareEngine(planned));
  }

  grpc::Status Rendezvous(grpc::ServerContext* ctx, const pb::RendezvousRequest* req,
                          pb::RendezvousResponse* out) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    engine::Membership m;
    m.generation = req->generation();
    m.world_size = req->world_size();
    m.rank = req->rank();
    if (req->restarts() < 0)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "restarts: expected >= 0");
    m.job_restarts = req->restarts();
    if (m.world_size > 1) {
      const std::string& address = req->store_address();
      const auto colon = address.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 || !ParsePort(address.substr(colon + 1), &port))
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "store_address: expected HOST:PORT, got \"" + address + "\"");
      m.store_host = address.substr(0, colon);
      m.store_port = port;
    }
    if (m.generation < 1)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "generation: expected >= 1");
    LiveState from;
    if (auto bad = AddressList(req->state_peers(), "state_peers", from.peers)) return *bad;
    if (!from.peers.empty() && req->state_step() < 1)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "state_step: expected >= 1 with state_peers");
    from.step = req->state_step();
    BuddyRing ring;
    if (auto bad = AddressList(req->members(), "members", ring.members)) return *bad;
    ring.ward = req->ward();
    Status accepted = runtime_.Rendezvous(m, std::move(from), std::move(ring));
    if (!accepted.ok()) return ToGrpc(accepted);
    out->set_generation(m.generation);
    return grpc::Status::OK;
  }

  grpc::Status Checkpoint(grpc::ServerContext* ctx, const pb::CheckpointRequest* req,
                          pb::CheckpointResponse* out) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    auto saved = runtime_.Checkpoint(req->pause(), DeadlineOf(ctx), req->barrier_id(), req->live());
    if (!saved.ok()) return ToGrpc(saved.status());
    contract::ToWire(Reported(*saved), out->mutable_checkpoint());
    return grpc::Status::OK;
  }

  grpc::Status Pause(grpc::ServerContext* ctx, const pb::PauseRequest* req,
                     pb::PauseResponse* out) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    auto step = runtime_.Pause(DeadlineOf(ctx), req->barrier_id());
    if (!step.ok()) return ToGrpc(step.status());
    out->set_step(*step);
    return grpc::Status::OK;
  }

  grpc::Status Resume(grpc::ServerContext* ctx, const pb::ResumeRequest*,
                      pb::ResumeResponse*) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    return ToGrpc(runtime_.Resume());
  }

  grpc::Status Shutdown(grpc::ServerContext* ctx, const pb::ShutdownRequest* req,
                        pb::ShutdownResponse*) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    runtime_.Shutdown(req->reason().empty() ? "Shutdown call" : req->reason());
    if (!shutdown_called_.exchange(true) && on_shutdown_) {
      // After this reply is on its way: the callback stops the server, which waits for
      // handlers like this one.
      shutdown_thread_ = std::thread([cb = on_shutdown_] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        cb();
      });
    }
    return grpc::Status::OK;
  }

  grpc::Status ReadState(grpc::ServerContext* ctx, const pb::ReadStateRequest* req,
                         grpc::ServerWriter<pb::StateChunk>* writer) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    objstore::MemoryStore& state = runtime_.peer_state();
    auto size = state.Size(req->key());
    if (!size.ok()) return ToGrpc(size.status());
    const uint64_t offset = req->offset();
    const uint64_t length = req->to_end() ? (offset <= *size ? *size - offset : 0) : req->length();
    // Past the end is an error before anything is sent (the store's message names the range).
    if (offset > *size || length > *size - offset)
      return ToGrpc(state.GetRange(req->key(), offset, length).status());
    constexpr uint64_t kChunk = 1 << 20;
    uint64_t at = offset;
    const uint64_t end = offset + length;
    bool first = true;
    do {
      pb::StateChunk chunk;
      if (first) chunk.set_object_size(*size);
      const uint64_t n = std::min(kChunk, end - at);
      std::string* data = chunk.mutable_data();
      data->resize(n);
      if (Status read = state.GetRangeInto(req->key(), at, n, data->data()); !read.ok())
        return ToGrpc(read);                               // replaced meanwhile by a smaller object
      if (!writer->Write(chunk)) return grpc::Status::OK;  // the caller went away
      at += n;
      first = false;
    } while (at < end);
    return grpc::Status::OK;
  }

  grpc::Status WatchSteps(grpc::ServerContext* ctx, const pb::WatchStepsRequest* req,
                          grpc::ServerWriter<pb::StepEvent>* writer) override {
    if (auto denied = Authenticate(ctx)) return *denied;
    uint64_t cursor = runtime_.FirstSeqAfterStep(req->after_step());
    while (!ctx->IsCancelled()) {
      auto events =
          runtime_.EventsAfter(cursor, 256, Clock::now() + std::chrono::milliseconds(500));
      for (const StepEvent& e : events) {
        pb::StepEvent out;
        contract::ToWire(Reported(e), &out);
        if (!writer->Write(out)) return grpc::Status::OK;  // the caller went away
        cursor = e.seq;
      }
      if (events.empty() && runtime_.exited()) break;
    }
    return grpc::Status::OK;
  }

 private:
  static bool ParsePort(const std::string& text, int* port) {
    if (text.empty() || text.size() > 5) return false;
    int value = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535) return false;
    *port = value;
    return true;
  }

  std::optional<grpc::Status> Authenticate(const grpc::ServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end())
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing authorization metadata: expected \"Bearer <job token>\"");
    const grpc::string_ref got = it->second;
    if (got.size() != expected_.size() ||
        CRYPTO_memcmp(got.data(), expected_.data(), expected_.size()) != 0)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the job token does not match");
    return std::nullopt;
  }

  WorkerRuntime& runtime_;
  const std::string expected_;
  std::function<void()> on_shutdown_;
  const Clock::time_point started_;
  std::atomic<bool> shutdown_called_{false};
  std::thread shutdown_thread_;
};

class GrpcControlServer final : public ControlServer {
 public:
  GrpcControlServer(std::unique_ptr<Service> service, std::unique_ptr<grpc::Server> server,
                    int port)
      : service_(std::move(service)), server_(std::move(server)), port_(port) {}
  ~GrpcControlServer() override { Stop(); }
  int port() const override { return port_; }
  void Stop() override {
    std::call_once(stopped_, [this] {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    });
  }

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::once_flag stopped_;
};

}  // namespace

StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(WorkerRuntime& runtime,
                                                              ControlServerOptions options) {
  if (options.token.empty())
    return InvalidArgument("the job token is empty: a worker never serves without one");
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty())
    return InvalidArgument("TLS: expected both a certificate and its key, or neither");
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (options.tls_cert_pem.empty()) {
    credentials = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  auto service = std::make_unique<Service>(runtime, options.token, options.on_shutdown);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0)
    return Unavailable("cannot serve gRPC on " + options.listen +
                       " (address in use, or not HOST:PORT)");
  LogInfo("control API listening",
          {{"address", options.listen}, {"port", port}, {"tls", !options.tls_cert_pem.empty()}});
  return std::unique_ptr<ControlServer>(
      std::make_unique<GrpcControlServer>(std::move(service), std::move(server), port));
}

}  // namespace tidal::worker
