// bench/idle_worker.cc — a sleeping stand-in for tidal-worker, for the operator-at-scale
// benchmark (bench/operator_scale.sh): it takes the same container arguments, serves the
// same control API (tidal.worker.v1, bearer token checked) on --listen, follows the protocol
// (Rendezvous → RUNNING at that generation, Checkpoint{pause} → PAUSED, Resume, Shutdown →
// exit) and trains nothing: its step advances with the wall clock and its loss is a fixed
// curve. No LibTorch, one small gRPC server, so a 2-core machine holds thousands of them.
// Never a worker: bench use only.
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "tidal/worker/v1/worker.grpc.pb.h"

namespace {

namespace pb = ::tidal::worker::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

constexpr double kStepSeconds = 1.0;

int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class IdleWorker final : public pb::WorkerControl::Service {
 public:
  explicit IdleWorker(std::string token) : token_("Bearer " + std::move(token)) {}

  Status GetStatus(ServerContext* c, const pb::GetStatusRequest*, pb::WorkerStatus* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    Advance();
    out->set_phase(phase_);
    out->set_generation(generation_);
    out->set_rank(rank_);
    out->set_world_size(world_size_);
    out->set_step(step_);
    out->set_max_steps(1000000);
    out->set_loss(step_ > 0 ? 4.0 / (1.0 + 0.01 * static_cast<double>(step_)) : 0);
    out->set_tokens_per_second(step_ > 0 ? 1000 : 0);
    out->set_job("idle");
    if (checkpoint_step_ >= 0) {
      auto* ck = out->mutable_last_checkpoint();
      ck->set_step(checkpoint_step_);
      ck->set_kind("full");
      ck->set_uri("idle://step-" + std::to_string(checkpoint_step_));
      ck->set_unix_millis(checkpoint_millis_);
    }
    return Status::OK;
  }
  Status Rendezvous(ServerContext* c, const pb::RendezvousRequest* in,
                    pb::RendezvousResponse* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    if (in->generation() <= generation_)
      return Status(StatusCode::FAILED_PRECONDITION, "generation is not newer");
    Advance();
    generation_ = in->generation();
    rank_ = in->rank();
    world_size_ = in->world_size();
    phase_ = pb::RUNNING;
    running_since_ = std::chrono::steady_clock::now();
    step_at_start_ = step_;
    out->set_generation(generation_);
    return Status::OK;
  }
  Status Checkpoint(ServerContext* c, const pb::CheckpointRequest* in,
                    pb::CheckpointResponse* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != pb::RUNNING && phase_ != pb::PAUSED)
      return Status(StatusCode::FAILED_PRECONDITION, "not in a generation");
    Advance();
    checkpoint_step_ = step_;
    checkpoint_millis_ = NowMillis();
    if (in->pause()) phase_ = pb::PAUSED;
    auto* ck = out->mutable_checkpoint();
    ck->set_step(step_);
    ck->set_kind("full");
    ck->set_uri("idle://step-" + std::to_string(step_));
    ck->set_unix_millis(checkpoint_millis_);
    return Status::OK;
  }
  Status Pause(ServerContext* c, const pb::PauseRequest*, pb::PauseResponse* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    Advance();
    phase_ = pb::PAUSED;
    out->set_step(step_);
    return Status::OK;
  }
  Status Resume(ServerContext* c, const pb::ResumeRequest*, pb::ResumeResponse*) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != pb::PAUSED) return Status(StatusCode::FAILED_PRECONDITION, "not paused");
    phase_ = pb::RUNNING;
    running_since_ = std::chrono::steady_clock::now();
    step_at_start_ = step_;
    return Status::OK;
  }
  Status Shutdown(ServerContext* c, const pb::ShutdownRequest*, pb::ShutdownResponse*) override {
    if (!Authorized(c)) return Unauthenticated();
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::_Exit(0);
    }).detach();
    return Status::OK;
  }

 private:
  bool Authorized(ServerContext* c) const {
    auto it = c->client_metadata().find("authorization");
    return it != c->client_metadata().end() &&
           std::string(it->second.data(), it->second.size()) == token_;
  }
  static Status Unauthenticated() {
    return Status(StatusCode::UNAUTHENTICATED, "missing or wrong job token");
  }
  void Advance() {  // under mu_: a step per kStepSeconds while RUNNING
    if (phase_ != pb::RUNNING) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
    step_ = step_at_start_ + static_cast<int64_t>(s / kStepSeconds);
  }

  const std::string token_;
  std::mutex mu_;
  pb::Phase phase_ = pb::WAITING;
  int64_t generation_ = 0, step_ = 0, step_at_start_ = 0;
  int rank_ = 0, world_size_ = 0;
  int64_t checkpoint_step_ = -1, checkpoint_millis_ = 0;
  std::chrono::steady_clock::time_point running_since_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen, token_file;
  for (int i = 1; i + 1 < argc; ++i) {  // tidal-worker's arguments; the rest are ignored
    const std::string flag = argv[i];
    if (flag == "--listen")
      listen = argv[++i];
    else if (flag == "--token-file")
      token_file = argv[++i];
  }
  std::ifstream in(token_file);
  std::stringstream token;
  token << in.rdbuf();
  std::string t = token.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  if (listen.empty() || t.empty()) {
    std::fprintf(stderr, "idle_worker: --listen and a non-empty --token-file are required\n");
    return 2;
  }
  IdleWorker service(t);
  grpc::ResourceQuota quota("idle-worker");
  quota.SetMaxThreads(4);
  grpc::ServerBuilder builder;
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "idle_worker: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  server->Wait();
  return 0;
}
