// worker/engine/comm.cc — c10d adapters. c10::Error thrown by a backend is turned into a
// Status here, naming the collective.
#include "worker/engine/comm.h"
#include "common/strings.h"

#include "worker/engine/torch_compat.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TIDAL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tidal::engine {
namespace {

class SingleRankComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  Status AllReduceSum(torch::Tensor&) override { return OkStatus(); }
  Status AllGather(const torch::Tensor& shard, torch::Tensor& full) override {
    if (!full.is_same(shard)) full.copy_(shard);
    return OkStatus();
  }
  Status ReduceScatterSum(const torch::Tensor& full, torch::Tensor& shard) override {
    if (!full.is_same(shard)) shard.copy_(full);
    return OkStatus();
  }
  Status Broadcast(torch::Tensor&, int) override { return OkStatus(); }
  Status Barrier() override { return OkStatus(); }
};

template <typename Fn>
Status Guard(const char* what, int rank, Fn&& fn) {
  try {
    fn();
    return OkStatus();
  } catch (const std::exception& e) {
    // A peer that died closes its connections: gloo reports it here. Retrying the collective
    // cannot help; the job must re-form (a new generation), so the code is Unavailable.
    const std::string msg = FirstLine(e.what());
    return Unavailable(std::string(what) + " failed on rank " + std::to_string(rank) +
                       " (a peer rank probably exited): " + msg);
  }
}

class ProcessGroupComm final : public Comm {
 public:
  ProcessGroupComm(c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<compat::CollectiveBackend> pg, int rank, int world, bool nccl)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), world_(world), nccl_(nccl) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return nccl_ ? "nccl" : "gloo"; }

  Status AllReduceSum(torch::Tensor& t) override {
    return Guard("all_reduce", rank_, [&] {
      std::vector<torch::Tensor> ts{t};
      pg_->allreduce(ts)->wait();
    });
  }

  Status AllGather(const torch::Tensor& shard, torch::Tensor& full) override {
    if (full.numel() != shard.numel() * world_)
      return Internal("all_gather: output has " + std::to_string(full.numel()) +
                      " elements, expected " + std::to_string(shard.numel() * world_));
    return Guard("all_gather", rank_, [&] {
      if (nccl_) {
        pg_->_allgather_base(full, const_cast<torch::Tensor&>(shard))->wait();
        return;
      }
      // gloo has no _allgather_base: gather into views of the flat output (gloo copies each
      // rank's contribution into its view, so no extra buffer is kept).
      std::vector<std::vector<torch::Tensor>> outputs(1);
      for (int r = 0; r < world_; ++r)
        outputs[0].push_back(full.narrow(0, r * shard.numel(), shard.numel()));
      std::vector<torch::Tensor> inputs{shard.contiguous()};
      pg_->allgather(outputs, inputs)->wait();
    });
  }

  Status ReduceScatterSum(const torch::Tensor& full, torch::Tensor& shard) override {
    if (full.numel() != shard.numel() * world_)
      return Internal("reduce_scatter: input has " + std::to_string(full.numel()) +
                      " elements, expected " + std::to_string(shard.numel() * world_));
    return Guard("reduce_scatter", rank_, [&] {
      if (nccl_) {
        pg_->_reduce_scatter_base(shard, const_cast<torch::Tensor&>(full))->wait();
        return;
      }
      // gloo has no reduce_scatter: all-reduce a copy and keep our slice. Twice the traffic of
      // a ring reduce-scatter, but exact (the same sum every rank computes).
      std::vector<torch::Tensor> ts{full.clone()};
      pg_->allreduce(ts)->wait();
      shard.copy_(ts[0].narrow(0, rank_ * shard.numel(), shard.numel()));
    });
  }

  Status Broadcast(torch::Tensor& t, int root) override {
    return Guard("broadcast", rank_, [&] {
      std::vector<torch::Tensor> ts{t};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      pg_->broadcast(ts, opts)->wait();
    });
  }

  Status Barrier() override {
    return Guard("barrier", rank_, [&] { pg_->barrier()->wait(); });
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<compat::CollectiveBackend> pg_;
  int rank_, world_;
  bool nccl_;
};

// True once something accepts TCP connections on host:port, polling every 10 ms until
// `deadline`. LibTorch's TCPStore client waits a whole second before retrying a refused
// connection; when a generation forms, every rank asks at once and rank 0's store is a few
// milliseconds from listening, so that second was most of a rescale's pause.
bool WaitUntilListening(const std::string& host, int port,
                        std::chrono::steady_clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool listening = false;
  while (!listening && std::chrono::steady_clock::now() < deadline) {
    for (addrinfo* ai = res; ai && !listening; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof(err);
        rc = poll(&p, 1, 200) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                     err == 0
                 ? 0
                 : -1;
      }
      close(fd);
      listening = rc == 0;
    }
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  freeaddrinfo(res);
  return listening;
}

class TcpStoreServer final : public StoreServer {
 public:
  explicit TcpStoreServer(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

std::unique_ptr<Comm> MakeSingleRankComm() { return std::make_unique<SingleRankComm>(); }

StatusOr<std::unique_ptr<Comm>> ConnectProcessGroup(const ProcessGroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return InvalidArgument("rank " + std::to_string(o.rank) + " is outside world size " +
                           std::to_string(o.world_size));
  if (o.world_size == 1) return MakeSingleRankComm();
  if (o.rank != 0 &&
      !WaitUntilListening(o.store_host, o.store_port, std::chrono::steady_clock::now() + o.timeout))
    return Unavailable("rank " + std::to_string(o.rank) + ": the rendezvous store at " +
                       o.store_host + ":" + std::to_string(o.store_port) +
                       " did not accept connections within " + std::to_string(o.timeout.count()) +
                       " ms");
  try {
    c10d::TCPStoreOptions store_opts;
    store_opts.port = static_cast<uint16_t>(o.store_port);
    store_opts.isServer = false;
    store_opts.waitWorkers = false;
    store_opts.timeout = o.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(o.store_host, store_opts);
    c10::intrusive_ptr<c10d::Store> store = tcp;
    // A generation's keys under its own prefix: a rank that reached another generation's
    // store by mistake waits (and times out) instead of reading foreign addresses.
    if (!o.key_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(o.key_prefix, store);
    c10::intrusive_ptr<compat::CollectiveBackend> pg;
    if (o.use_cuda) {
#ifdef TIDAL_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = o.timeout;
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size, opts);
#else
      return FailedPrecondition("NCCL requested but this build's LibTorch has no CUDA");
#endif
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.interface_host));
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, opts);
    }
    return std::unique_ptr<Comm>(
        std::make_unique<ProcessGroupComm>(store, pg, o.rank, o.world_size, o.use_cuda));
  } catch (const std::exception& e) {
    const std::string msg = FirstLine(e.what());
    return Unavailable("rank " + std::to_string(o.rank) + " could not join the process group at " +
                       o.store_host + ":" + std::to_string(o.store_port) + ": " + msg);
  }
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port) {
  if (port < 0 || port > 65535) return InvalidArgument("store port " + std::to_string(port));
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = true;
    opts.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
    return std::unique_ptr<StoreServer>(std::make_unique<TcpStoreServer>(store));
  } catch (const std::exception& e) {
    return Unavailable("cannot start the rendezvous store on " + host + ":" + std::to_string(port) +
                       ": " + e.what());
  }
}

}  // namespace tidal::engine
