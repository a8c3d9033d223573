// bench/idle_worker_hub.cc — serves the control API of every sleeping stand-in worker of the
// operator-at-scale benchmark (bench/operator_scale.sh) from one process. Each stand-in pod
// runs bench/idle_worker.cc, which asks this hub over a Unix socket to serve its address and
// then sleeps; the hub answers as tidal-worker would (tidal.worker.v1, bearer token checked:
// Rendezvous → RUNNING at that generation, Checkpoint{pause} → PAUSED, Resume, Shutdown →
// that pod's process exits) and trains nothing: a step advances with the wall clock and the
// loss is a fixed curve. One gRPC runtime for thousands of pods: a gRPC server per process
// wakes its timer threads every second, which at 1,200 stand-ins kept 2 cores at load 170.
// Never a worker: bench use only.
//
//   idle_worker_hub --socket PATH
//   protocol, one Unix stream connection per pod: "LISTEN host:port token\n" → "OK\n" or
//   "ERR why\n"; later "EXIT\n" from the hub when the pod was told to shut down. The pod's
//   connection closing (it was killed) stops its server. "STEPS\n" on a connection of its
//   own → a line "host:port generation rank step" per pod served, then "END\n": what the
//   workers report now, for the bench's status lag.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "contract/wire.h"
#include "contract/worker_status.h"
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
  // `exit` tells the pod's process to exit (on Shutdown).
  IdleWorker(std::string token, std::function<void()> exit)
      : token_("Bearer " + std::move(token)), exit_(std::move(exit)) {}

  Status GetStatus(ServerContext* c, const pb::GetStatusRequest*, pb::WorkerStatus* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    FillLocked(out);
    return Status::OK;
  }
  // As tidal-worker's: at once, then on every change the operator acts on, step figures at most
  // every min_interval_ms, a heartbeat otherwise. Woken by the RPCs that change the state, and
  // once a second (a step).
  Status WatchStatus(ServerContext* c, const pb::WatchStatusRequest* req,
                     grpc::ServerWriter<pb::WorkerStatus>* writer) override {
    if (!Authorized(c)) return Unauthenticated();
    using std::chrono::milliseconds;
    const milliseconds min_interval(req->min_interval_ms() > 0 ? req->min_interval_ms() : 1000);
    const milliseconds heartbeat(req->heartbeat_ms() > 0 ? req->heartbeat_ms() : 10000);
    std::optional<tidal::contract::WorkerStatus> sent_actionable;
    int64_t sent_step = -1;
    std::optional<std::chrono::steady_clock::time_point> sent_at;
    std::unique_lock<std::mutex> lock(mu_);
    while (!c->IsCancelled() && !exiting_) {
      pb::WorkerStatus s;
      FillLocked(&s);
      tidal::contract::WorkerStatus actionable =
          tidal::contract::ActionablePart(*tidal::contract::FromWire(s));
      const auto now = std::chrono::steady_clock::now();
      if (!sent_at || actionable != sent_actionable ||
          (s.step() != sent_step && now - *sent_at >= min_interval) ||
          now - *sent_at >= heartbeat) {
        lock.unlock();
        const bool written = writer->Write(s);
        lock.lock();
        if (!written) break;
        sent_actionable = std::move(actionable);
        sent_step = s.step();
        sent_at = now;
      }
      // Until the next step (as tidal-worker's stream wakes on a step), or a change.
      changed_.wait_for(lock, UntilNextStepLocked());
    }
    return Status::OK;
  }

 private:
  void FillLocked(pb::WorkerStatus* out) {
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
  }

 public:
  Status Rendezvous(ServerContext* c, const pb::RendezvousRequest* in,
                    pb::RendezvousResponse* out) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    changed_.notify_all();
    if (in->generation() == generation_)
      return Status(StatusCode::ALREADY_EXISTS, "generation is this worker's already");
    if (in->generation() < generation_)
      return Status(StatusCode::FAILED_PRECONDITION, "generation is older than this worker's");
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
    changed_.notify_all();
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
    changed_.notify_all();
    phase_ = pb::PAUSED;
    out->set_step(step_);
    return Status::OK;
  }
  Status Resume(ServerContext* c, const pb::ResumeRequest*, pb::ResumeResponse*) override {
    if (!Authorized(c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != pb::PAUSED) return Status(StatusCode::FAILED_PRECONDITION, "not paused");
    changed_.notify_all();
    phase_ = pb::RUNNING;
    running_since_ = std::chrono::steady_clock::now();
    step_at_start_ = step_;
    return Status::OK;
  }
  std::string Steps() {
    std::lock_guard<std::mutex> lock(mu_);
    Advance();
    return std::to_string(generation_) + " " + std::to_string(rank_) + " " +
           std::to_string(phase_ == pb::RUNNING ? step_ : -1);
  }
  Status Shutdown(ServerContext* c, const pb::ShutdownRequest*, pb::ShutdownResponse*) override {
    if (!Authorized(c)) return Unauthenticated();
    {
      std::lock_guard<std::mutex> lock(mu_);
      exiting_ = true;
      changed_.notify_all();
    }
    exit_();
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
  std::chrono::nanoseconds UntilNextStepLocked() const {
    if (phase_ != pb::RUNNING) return std::chrono::seconds(1);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
    const double next = (std::floor(s / kStepSeconds) + 1) * kStepSeconds;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::duration<double>(next - s)) +
           std::chrono::milliseconds(1);
  }
  void Advance() {  // under mu_: a step per kStepSeconds while RUNNING
    if (phase_ != pb::RUNNING) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
    step_ = step_at_start_ + static_cast<int64_t>(s / kStepSeconds);
  }

  const std::string token_;
  const std::function<void()> exit_;
  std::mutex mu_;
  std::condition_variable changed_;  // the state changed (a status stream writes at once)
  bool exiting_ = false;
  pb::Phase phase_ = pb::WAITING;
  int64_t generation_ = 0, step_ = 0, step_at_start_ = 0;
  int rank_ = 0, world_size_ = 0;
  int64_t checkpoint_step_ = -1, checkpoint_millis_ = 0;
  std::chrono::steady_clock::time_point running_since_;
};

// The pods served now, by address (for STEPS).
std::mutex g_mu;
std::map<std::string, IdleWorker*> g_served;

// One pod: its connection, service and server, served until the connection closes.
void ServePod(int fd) {
  std::string line;
  char c;
  while (line.size() < 4096 && ::read(fd, &c, 1) == 1 && c != '\n') line += c;
  std::istringstream words(line);
  std::string verb, address, token;
  words >> verb >> address >> token;
  auto reply = [fd](const std::string& text) {
    return ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  };
  if (verb == "STEPS") {
    std::string out;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      for (const auto& [served, worker] : g_served) out += served + " " + worker->Steps() + "\n";
    }
    reply(out + "END\n");
    ::close(fd);
    return;
  }
  if (verb != "LISTEN" || address.empty() || token.empty()) {
    reply("ERR expected: LISTEN host:port token\n");
    ::close(fd);
    return;
  }
  IdleWorker service(token, [fd, reply] { reply("EXIT\n"); });
  grpc::ServerBuilder builder;
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    reply("ERR cannot listen on " + address + "\n");
    ::close(fd);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_served[address] = &service;
  }
  reply("OK\n");
  while (::read(fd, &c, 1) > 0) {
  }  // the pod's process ended (killed, or exited after EXIT)
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_served.erase(address);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--socket") {
    std::fprintf(stderr, "usage: idle_worker_hub --socket PATH\n");
    return 2;
  }
  const std::string path = argv[2];
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    std::fprintf(stderr, "idle_worker_hub: --socket: path longer than %zu bytes\n",
                 sizeof(addr.sun_path) - 1);
    return 2;
  }
  std::strcpy(addr.sun_path, path.c_str());
  ::unlink(path.c_str());
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1024) != 0) {
    std::fprintf(stderr, "idle_worker_hub: %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  std::printf("listening on %s\n", path.c_str());
  std::fflush(stdout);
  while (true) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "idle_worker_hub: accept: %s\n", std::strerror(errno));
      return 1;
    }
    std::thread(ServePod, fd).detach();
  }
}
