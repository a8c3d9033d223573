// worker/engine/comm.h — the small collective-communication interface the ZeRO code is
// written against. Implementations: a single-rank one (no communication) and one over c10d
// process groups (gloo on CPU with a TCPStore rendezvous, NCCL when LibTorch has CUDA); both
// backends of PyTorch 2.x have the flat all-gather and reduce-scatter the ZeRO code uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "worker/engine/store_server.h"

namespace tidal::engine {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;

  // In place: t ← Σ_ranks t.
  virtual Status AllReduceSum(torch::Tensor& t) = 0;
  // full (1-D, world_size × shard.numel()) ← concatenation of every rank's shard, rank order.
  virtual Status AllGather(const torch::Tensor& shard, torch::Tensor& full) = 0;
  // shard ← slice `rank` of Σ_ranks full (full is 1-D, world_size × shard.numel()).
  virtual Status ReduceScatterSum(const torch::Tensor& full, torch::Tensor& shard) = 0;
  virtual Status Broadcast(torch::Tensor& t, int root) = 0;
  virtual Status Barrier() = 0;
  // A barrier that waits up to `timeout` for the other ranks instead of the group's collective
  // timeout: the ranks of a new generation meet there once each has built its engine, which
  // takes a rank that loads its base weights far longer than one that kept them. Gloo honours
  // it; under NCCL the group's own timeout bounds it.
  virtual Status WaitForAll(std::chrono::milliseconds timeout) = 0;

  // The device every tensor handed to a collective must be on: the CPU for gloo, the rank's
  // GPU for NCCL (which accepts nothing else), the training device for a single rank. Every
  // collective refuses a tensor on another device, a sparse or a non-contiguous one, with an
  // error naming the collective (and both devices), before the backend sees it.
  virtual torch::Device device() const = 0;

  // Control traffic in host values (flags, agreements, string lengths): moved to device() for
  // the collective and back. Callers build no tensor for it, so none can be on the wrong
  // device. Element-wise sum / broadcast from `root` / every rank's string in rank order.
  Status AllReduceSumHost(std::vector<int64_t>& values);
  Status AllReduceSumHost(std::vector<double>& values);
  Status BroadcastHost(std::vector<int64_t>& values, int root);
  StatusOr<std::vector<std::string>> AllGatherStrings(const std::string& mine);
};

// World size 1: every collective is the identity (the device rule still holds).
std::unique_ptr<Comm> MakeSingleRankComm(torch::Device device = torch::kCPU);

// Rank `rank` of `world_size` planned, with no group connected yet: what an engine prepared
// ahead of its generation (Session::Prepare) is cut for. Every collective fails with
// FailedPrecondition; only the rank, the world size and the device answer.
std::unique_ptr<Comm> MakePlannedComm(int rank, int world_size, torch::Device device);

struct ProcessGroupOptions {
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  int rank = 0;
  int world_size = 1;
  // Address gloo binds its pairs to; loopback for local runs, the pod IP in a cluster.
  std::string interface_host = "127.0.0.1";
  // Bound on any one collective or rendezvous wait; a dead peer is usually seen at once as a
  // closed connection, this catches the silent (hung) case.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  bool use_cuda = false;  // NCCL instead of gloo, on GPU `cuda_device`
  int cuda_device = 0;
  std::string key_prefix;  // namespaces the group's store keys (e.g. per generation)
};

// Joins the process group; blocks until every rank has joined or the timeout passes. World
// size 1 needs no group: the single-rank Comm, without a store.
StatusOr<std::unique_ptr<Comm>> ConnectProcessGroup(const ProcessGroupOptions& options);

}  // namespace tidal::engine
