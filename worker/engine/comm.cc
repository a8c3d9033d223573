// worker/engine/comm.cc — c10d adapters. c10::Error thrown by a backend is turned into a
// Status here, naming the collective.
#include "worker/engine/comm.h"
#include "common/strings.h"

#include "worker/engine/torch_compat.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TIDAL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tidal::engine {
namespace {

// The device rule of Comm::device(), checked before a collective reaches its backend.
Status CheckTensor(const char* what, const torch::Tensor& t, const torch::Device& device,
                   const std::string& backend) {
  if (!t.defined()) return Internal(std::string(what) + ": undefined tensor");
  if (t.layout() != torch::kStrided)
    return Internal(std::string(what) + ": a sparse tensor; " + backend +
                    " collectives take dense tensors");
  if (!t.is_contiguous())
    return Internal(std::string(what) + ": a non-contiguous tensor; " + backend +
                    " collectives take contiguous ones");
  if (t.device() != device)
    return Internal(std::string(what) + ": tensor on " + t.device().str() + ", but the " + backend +
                    " process group's collectives take tensors on " + device.str());
  return OkStatus();
}

class SingleRankComm final : public Comm {
 public:
  explicit SingleRankComm(torch::Device device) : device_(device) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  torch::Device device() const override { return device_; }
  Status AllReduceSum(torch::Tensor& t) override { return Check("all_reduce", t); }
  Status AllGather(const torch::Tensor& shard, torch::Tensor& full) override {
    TIDAL_RETURN_IF_ERROR(Check("all_gather", shard));
    TIDAL_RETURN_IF_ERROR(Check("all_gather", full));
    if (!full.is_same(shard)) full.copy_(shard);
    return OkStatus();
  }
  Status ReduceScatterSum(const torch::Tensor& full, torch::Tensor& shard) override {
    TIDAL_RETURN_IF_ERROR(Check("reduce_scatter", full));
    TIDAL_RETURN_IF_ERROR(Check("reduce_scatter", shard));
    if (!full.is_same(shard)) shard.copy_(full);
    return OkStatus();
  }
  Status Broadcast(torch::Tensor& t, int) override { return Check("broadcast", t); }
  Status Barrier() override { return OkStatus(); }
  Status WaitForAll(std::chrono::milliseconds) override { return OkStatus(); }

 private:
  Status Check(const char* what, const torch::Tensor& t) const {
    return CheckTensor(what, t, device_, "single-rank");
  }
  torch::Device device_;
};

class PlannedComm final : public Comm {
 public:
  PlannedComm(int rank, int world_size, torch::Device device)
      : rank_(rank), world_size_(world_size), device_(device) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "none (planned)"; }
  torch::Device device() const override { return device_; }
  Status AllReduceSum(torch::Tensor&) override { return Refuse("all_reduce"); }
  Status AllGather(const torch::Tensor&, torch::Tensor&) override { return Refuse("all_gather"); }
  Status ReduceScatterSum(const torch::Tensor&, torch::Tensor&) override {
    return Refuse("reduce_scatter");
  }
  Status Broadcast(torch::Tensor&, int) override { return Refuse("broadcast"); }
  Status Barrier() override { return Refuse("barrier"); }
  Status WaitForAll(std::chrono::milliseconds) override { return Refuse("wait_for_all"); }

 private:
  Status Refuse(const char* what) const {
    return FailedPrecondition(std::string(what) + ": rank " + std::to_string(rank_) + " of " +
                              std::to_string(world_size_) +
                              " is planned, not in a process group yet");
  }
  int rank_, world_size_;
  torch::Device device_;
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

// LibTorch's FlightRecorder (one per process, on by default: TORCH_FR_BUFFER_SIZE=2000) records
// every gloo collective at enqueue, inserting the group into a std::map *before* taking its own
// mutex (torch 2.11, FlightRecorderDetail.hpp). Groups of one process — ranks run as threads,
// as the engine's tests do — enqueueing at once corrupt that map: a rare SIGSEGV in
// _Rb_tree_insert_and_rebalance (reproduced under gdb). Gloo enqueues take this lock; the wait
// stays outside it, since a collective's peers may be threads of this process.
std::mutex& GlooEnqueueMutex() {
  static std::mutex mutex;
  return mutex;
}

class ProcessGroupComm final : public Comm {
 public:
  ProcessGroupComm(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> pg,
                   int rank, int world, bool nccl, torch::Device device)
      : store_(std::move(store)),
        pg_(std::move(pg)),
        rank_(rank),
        world_(world),
        nccl_(nccl),
        device_(device) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return nccl_ ? "nccl" : "gloo"; }
  torch::Device device() const override { return device_; }

  Status AllReduceSum(torch::Tensor& t) override {
    TIDAL_RETURN_IF_ERROR(Check("all_reduce", t));
    return Guard("all_reduce", rank_, [&] {
      std::vector<torch::Tensor> ts{t};
      EnqueueAndWait([&] { return pg_->allreduce(ts); });
    });
  }

  Status AllGather(const torch::Tensor& shard, torch::Tensor& full) override {
    if (full.numel() != shard.numel() * world_)
      return Internal("all_gather: output has " + std::to_string(full.numel()) +
                      " elements, expected " + std::to_string(shard.numel() * world_));
    TIDAL_RETURN_IF_ERROR(Check("all_gather", shard));
    TIDAL_RETURN_IF_ERROR(Check("all_gather", full));
    return Guard("all_gather", rank_, [&] {
      EnqueueAndWait([&] { return pg_->_allgather_base(full, const_cast<torch::Tensor&>(shard)); });
    });
  }

  Status ReduceScatterSum(const torch::Tensor& full, torch::Tensor& shard) override {
    if (full.numel() != shard.numel() * world_)
      return Internal("reduce_scatter: input has " + std::to_string(full.numel()) +
                      " elements, expected " + std::to_string(shard.numel() * world_));
    TIDAL_RETURN_IF_ERROR(Check("reduce_scatter", full));
    TIDAL_RETURN_IF_ERROR(Check("reduce_scatter", shard));
    return Guard("reduce_scatter", rank_, [&] {
      EnqueueAndWait(
          [&] { return pg_->_reduce_scatter_base(shard, const_cast<torch::Tensor&>(full)); });
    });
  }

  Status Broadcast(torch::Tensor& t, int root) override {
    TIDAL_RETURN_IF_ERROR(Check("broadcast", t));
    return Guard("broadcast", rank_, [&] {
      std::vector<torch::Tensor> ts{t};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      EnqueueAndWait([&] { return pg_->broadcast(ts, opts); });
    });
  }

  Status Barrier() override {
    return Guard("barrier", rank_, [&] { EnqueueAndWait([&] { return pg_->barrier(); }); });
  }
  Status WaitForAll(std::chrono::milliseconds timeout) override {
    return Guard("barrier", rank_, [&] {
      c10d::BarrierOptions opts;
      opts.timeout = timeout;
      EnqueueAndWait([&] { return pg_->barrier(opts); });
    });
  }

 private:
  // Starts a collective (under GlooEnqueueMutex for gloo) and waits for it outside the lock.
  template <typename Enqueue>
  void EnqueueAndWait(Enqueue&& enqueue) {
    c10::intrusive_ptr<c10d::Work> work;
    if (nccl_) {
      work = enqueue();
    } else {
      std::lock_guard<std::mutex> lock(GlooEnqueueMutex());
      work = enqueue();
    }
    work->wait();
  }
  Status Check(const char* what, const torch::Tensor& t) const {
    return CheckTensor(what, t, device_, backend());
  }
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  int rank_, world_;
  bool nccl_;
  torch::Device device_;
};

// Host values → a tensor on the group's device, and back.
template <typename T>
torch::Tensor ToDevice(const std::vector<T>& values, torch::ScalarType dtype,
                       const torch::Device& device) {
  return torch::from_blob(const_cast<T*>(values.data()), {static_cast<int64_t>(values.size())},
                          dtype)
      .to(device, /*non_blocking=*/false, /*copy=*/true);
}
template <typename T>
void FromDevice(const torch::Tensor& t, std::vector<T>& values) {
  auto host = t.to(torch::kCPU).contiguous();
  std::memcpy(values.data(), host.data_ptr(), values.size() * sizeof(T));
}

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

// A listening TCP socket bound to host:port (port 0: the kernel picks), for the store.
// SO_REUSEADDR as c10d sets it: a generation reuses the port of one eight generations back,
// whose connections may still be in TIME_WAIT.
StatusOr<int> ListenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return Unavailable("cannot start the rendezvous store on " + where + ": " + gai_strerror(rc));
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return Unavailable("cannot start the rendezvous store on " + where + ": " + error);
  return fd;
}

// After a failed TCPStore construction the listening socket may or may not have been closed
// by it; close it only while the number still names a socket listening on our port, so a
// descriptor another thread opened since is never touched.
void CloseIfStillBound(int fd, int port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int listening = 0;
  socklen_t opt_len = sizeof(listening);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &opt_len) != 0 || !listening) return;
  int bound = 0;
  if (addr.ss_family == AF_INET)
    bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  else if (addr.ss_family == AF_INET6)
    bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  if (port == 0 || bound == port) close(fd);
}

class TcpStoreServer final : public StoreServer {
 public:
  explicit TcpStoreServer(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

namespace {

template <typename T>
Status AllReduceSumHostValues(Comm& comm, std::vector<T>& values, torch::ScalarType dtype) {
  if (values.empty()) return OkStatus();
  auto t = ToDevice(values, dtype, comm.device());
  TIDAL_RETURN_IF_ERROR(comm.AllReduceSum(t));
  FromDevice(t, values);
  return OkStatus();
}

}  // namespace

Status Comm::AllReduceSumHost(std::vector<int64_t>& values) {
  return AllReduceSumHostValues(*this, values, torch::kInt64);
}

Status Comm::AllReduceSumHost(std::vector<double>& values) {
  return AllReduceSumHostValues(*this, values, torch::kFloat64);
}

Status Comm::BroadcastHost(std::vector<int64_t>& values, int root) {
  if (values.empty()) return OkStatus();
  auto t = ToDevice(values, torch::kInt64, device());
  TIDAL_RETURN_IF_ERROR(Broadcast(t, root));
  FromDevice(t, values);
  return OkStatus();
}

StatusOr<std::vector<std::string>> Comm::AllGatherStrings(const std::string& mine) {
  const int world = world_size();
  std::vector<int64_t> lengths(static_cast<size_t>(world), 0);
  lengths[static_cast<size_t>(rank())] = static_cast<int64_t>(mine.size());
  TIDAL_RETURN_IF_ERROR(AllReduceSumHost(lengths));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  std::vector<uint8_t> padded(static_cast<size_t>(longest), 0);
  std::memcpy(padded.data(), mine.data(), mine.size());
  auto shard = ToDevice(padded, torch::kUInt8, device());
  auto all = torch::empty({longest * world}, torch::TensorOptions(torch::kUInt8).device(device()));
  TIDAL_RETURN_IF_ERROR(AllGather(shard, all));
  all = all.to(torch::kCPU).contiguous();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r)
    out.emplace_back(static_cast<const char*>(all.data_ptr()) + r * longest,
                     static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  return out;
}

std::unique_ptr<Comm> MakeSingleRankComm(torch::Device device) {
  return std::make_unique<SingleRankComm>(device);
}

std::unique_ptr<Comm> MakePlannedComm(int rank, int world_size, torch::Device device) {
  return std::make_unique<PlannedComm>(rank, world_size, device);
}

StatusOr<std::unique_ptr<Comm>> ConnectProcessGroup(const ProcessGroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return InvalidArgument("rank " + std::to_string(o.rank) + " is outside world size " +
                           std::to_string(o.world_size));
  if (o.world_size == 1)
    return MakeSingleRankComm(
        o.use_cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.cuda_device))
                   : torch::Device(torch::kCPU));
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
    if (!o.key_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(o.key_prefix, store);
    c10::intrusive_ptr<c10d::Backend> pg;
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
    const torch::Device device =
        o.use_cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.cuda_device))
                   : torch::Device(torch::kCPU);
    return std::unique_ptr<Comm>(
        std::make_unique<ProcessGroupComm>(store, pg, o.rank, o.world_size, o.use_cuda, device));
  } catch (const std::exception& e) {
    const std::string msg = FirstLine(e.what());
    return Unavailable("rank " + std::to_string(o.rank) + " could not join the process group at " +
                       o.store_host + ":" + std::to_string(o.store_port) + ": " + msg);
  }
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port) {
  if (port < 0 || port > 65535) return InvalidArgument("store port " + std::to_string(port));
  const std::string where = host + ":" + std::to_string(port);
  // c10d's own server listens on every address of the machine. Pods that share one network
  // namespace (tidal local's, host-network pods) would then collide: two jobs whose ranks 0
  // are at the same generation ask for the same port, and a rank could reach the other
  // job's store. The store listens on its rank's own address instead, a socket bound here.
  TIDAL_ASSIGN_OR_RETURN(const int fd, ListenOn(host, port));
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.masterListenFd = fd;  // the store owns it from here and closes it when it goes
    auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
    return std::unique_ptr<StoreServer>(std::make_unique<TcpStoreServer>(store));
  } catch (const std::exception& e) {
    CloseIfStillBound(fd, port);
    return Unavailable("cannot start the rendezvous store on " + where + ": " +
                       FirstLine(e.what()));
  }
}

}  // namespace tidal::engine
