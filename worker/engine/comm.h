// worker/engine/comm.h — the small collective-communication interface the ZeRO code is
// written against. Implementations: a single-rank one (no communication) and one over c10d
// process groups (gloo on CPU with a TCPStore rendezvous, NCCL when LibTorch has CUDA). Where
// a backend lacks a collective (gloo 1.13: reduce_scatter, _allgather_base) the
// implementation provides a correct fallback, so callers never care.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

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
};

// World size 1: every collective is the identity.
std::unique_ptr<Comm> MakeSingleRankComm();

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
  bool use_cuda = false;   // NCCL instead of gloo
  std::string key_prefix;  // namespaces the group's store keys (e.g. per generation)
};

// Joins the process group; blocks until every rank has joined or the timeout passes. World
// size 1 needs no group: the single-rank Comm, without a store.
StatusOr<std::unique_ptr<Comm>> ConnectProcessGroup(const ProcessGroupOptions& options);

}  // namespace tidal::engine
