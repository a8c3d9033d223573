// worker/engine/session.cc — a generation's process group and trainer, with every LibTorch
// exception turned into a Status at this boundary.
#include "worker/engine/session.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/strings.h"
#include "worker/engine/comm.h"
#include "worker/engine/numa.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/torch_compat.h"
#include "worker/engine/trainer.h"

namespace tidal::engine {
namespace {

constexpr int kFlagBits = 16;

// Written to path.tmp and renamed: a reader never sees half a file.
Status WriteJsonFile(const std::string& path, const nlohmann::json& json) {
  {
    std::ofstream out(path + ".tmp");
    out << json.dump(2) << "\n";
    if (!out.flush()) return Unavailable("cannot write " + path + ".tmp");
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return Unavailable("cannot write " + path + ": " + ec.message());
  return OkStatus();
}

class TrainerSession final : public Session {
 public:
  TrainerSession(Membership membership, TrainConfig config, std::unique_ptr<StoreServer> store)
      : membership_(std::move(membership)), config_(std::move(config)), store_(std::move(store)) {}
  ~TrainerSession() override {
    trainer_.reset();  // leaves the process group before rank 0's store goes away
    store_.reset();
  }

  static StatusOr<std::unique_ptr<Comm>> Connect(const TrainConfig& config, const Membership& m,
                                                 const SessionOptions& options) {
    ProcessGroupOptions group;
    group.store_host = m.store_host;
    group.store_port = m.store_port;
    group.rank = m.rank;
    group.world_size = m.world_size;
    group.interface_host = m.interface_host;
    group.timeout = m.timeout;
    group.use_cuda = compat::CudaAvailable();
    group.cuda_device = options.cuda_device;
    // The job and the generation: a rank that reached another generation's store, or
    // another job's, waits (and times out) instead of reading foreign addresses.
    group.key_prefix =
        config.namespace_ + "/" + config.name + "/generation-" + std::to_string(m.generation);
    const auto start = std::chrono::steady_clock::now();
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, ConnectProcessGroup(group));
    LogInfo("process group connected",
            {{"world_size", m.world_size},
             {"seconds",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
    return comm;
  }

  Status Build(const TrainConfig& config, const SessionOptions& options) {
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, Connect(config, membership_, options));
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<RowSource> rows, OpenData(config, options, *comm));
    TIDAL_RETURN_IF_ERROR(CreateTrainer(config, options, std::move(comm), std::move(rows)));
    return WaitForEveryEngine();
  }

  // Session::Prepare: the engine cut for the planned rank and world size, in no group. The job
  // runs, so its rows are prepared already: this rank only opens them.
  Status BuildPlanned(const TrainConfig& config, const SessionOptions& options) {
    if (!options.data) return Internal("session: no data provider");
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<RowSource> rows,
                           options.data->Open(config, membership_.rank));
    std::unique_ptr<Comm> planned =
        MakePlannedComm(membership_.rank, membership_.world_size, DeviceFor(options));
    TIDAL_RETURN_IF_ERROR(CreateTrainer(config, options, std::move(planned), std::move(rows)));
    trainer_->LeaveGroup();  // keeps the base weights for the Regroup, as between generations
    return OkStatus();
  }

  // A pod's worker trains on GPU 0, the one the container runtime gave it
  // (CUDA_VISIBLE_DEVICES); tidal-train's local ranks on one GPU each.
  static torch::Device DeviceFor(const SessionOptions& options) {
    if (!compat::CudaAvailable()) return torch::kCPU;
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
  }

  Status CreateTrainer(const TrainConfig& config, const SessionOptions& options,
                       std::unique_ptr<Comm> comm, std::unique_ptr<RowSource> rows) {
    TrainerOptions trainer_options;
    trainer_options.max_steps = options.max_steps;
    trainer_options.data = std::move(rows);
    if (!config.model.uri.empty()) {
      TIDAL_ASSIGN_OR_RETURN(trainer_options.model_files,
                             options.data->OpenModel(config.model.uri));
    }
    trainer_options.device = DeviceFor(options);
    trainer_options.read_ahead_max_bytes = options.read_ahead_max_bytes;
    TIDAL_ASSIGN_OR_RETURN(trainer_,
                           Trainer::Create(config, std::move(comm), std::move(trainer_options)));
    return OkStatus();
  }

  // Every rank of the generation has its engine: the ranks that kept theirs wait here, for as
  // long as loading takes, for those that joined.
  Status WaitForEveryEngine() {
    const auto start = std::chrono::steady_clock::now();
    TIDAL_RETURN_IF_ERROR(trainer_->comm().WaitForAll(membership_.ready_timeout));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > 1.0) LogInfo("waited for the other ranks' engines", {{"seconds", waited}});
    return OkStatus();
  }

  // Rank 0 prepares the data (tidal-prep's work when spec.dataset.uri names JSONL) while the
  // others wait at a barrier that also tells them whether it worked; then every rank opens it.
  // A rank that regroups has its rows open already (and, as rank 0, prepared them in an
  // earlier generation): it takes part in the barrier with `prepared` already done.
  static Status DataBarrier(const TrainConfig& config, const SessionOptions& options, Comm& comm,
                            bool already_open) {
    if (!options.data) return Internal("session: no data provider");
    Status prepared;
    if (comm.rank() == 0 && !already_open) prepared = options.data->Prepare(config);
    std::vector<int64_t> failed{prepared.ok() ? 0 : 1};
    TIDAL_RETURN_IF_ERROR(comm.AllReduceSumHost(failed));
    if (!prepared.ok()) return prepared;
    if (failed[0] > 0)
      return FailedPrecondition("rank 0 could not prepare spec.dataset (its log says why)");
    return OkStatus();
  }
  StatusOr<std::unique_ptr<RowSource>> OpenData(const TrainConfig& config,
                                                const SessionOptions& options, Comm& comm) {
    TIDAL_RETURN_IF_ERROR(DataBarrier(config, options, comm, /*already_open=*/false));
    return options.data->Open(config, comm.rank());
  }

  Status Regroup(const Membership& next, const SessionOptions& options) override {
    if (!usable_ || !trainer_) return FailedPrecondition("session: its engine did not survive");
    try {
      return RegroupOrThrow(next, options);
    } catch (const std::exception& e) {
      usable_ = false;
      return Unavailable("rank " + std::to_string(next.rank) +
                         " could not regroup into generation " + std::to_string(next.generation) +
                         ": " + FirstLine(e.what()));
    }
  }
  bool usable() const override { return usable_ && trainer_ != nullptr; }

  Status ReadAhead(const Membership& planned, const std::function<bool()>& cancelled,
                   bool* complete) override {
    if (planned.world_size < 1 || planned.rank < 0 || planned.rank >= planned.world_size)
      return InvalidArgument("rank " + std::to_string(planned.rank) + " is outside world size " +
                             std::to_string(planned.world_size));
    return Guard<bool>([&]() -> StatusOr<bool> {
             TIDAL_RETURN_IF_ERROR(
                 trainer_->ReadAhead(planned.rank, planned.world_size, cancelled, complete));
             return true;
           })
        .status();
  }

  Status RegroupOrThrow(const Membership& next, const SessionOptions& options) {
    if (next.world_size < 1 || next.rank < 0 || next.rank >= next.world_size)
      return InvalidArgument("rank " + std::to_string(next.rank) + " is outside world size " +
                             std::to_string(next.world_size));
    TIDAL_RETURN_IF_ERROR(config_.ValidateForWorldSize(next.world_size));
    const auto start = std::chrono::steady_clock::now();
    // The old group is left (a gloo one's connections close in the background; gloo no
    // longer needs the store once connected) and rank 0's store stops before the new store
    // may take the same port.
    trainer_->LeaveGroup();
    store_.reset();
    const double leaving =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    membership_ = next;
    if (next.rank == 0 && next.world_size > 1 && next.rank0_hosts_store) {
      TIDAL_ASSIGN_OR_RETURN(store_, StoreServer::Start(next.store_host, next.store_port));
    }
    // Until here a failure leaves the engine whole: a later Regroup can try again.
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, Connect(config_, next, options));
    TIDAL_RETURN_IF_ERROR(DataBarrier(config_, options, *comm, /*already_open=*/true));
    Status joined = trainer_->JoinGroup(std::move(comm));
    if (!joined.ok()) {
      usable_ = false;
      return joined;
    }
    LogInfo("engine kept",
            {{"world_size", next.world_size},
             {"leaving_old_group_seconds", leaving},
             {"seconds",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
    return WaitForEveryEngine();
  }

  const Membership& membership() const override { return membership_; }
  int64_t step() const override { return trainer_->step(); }
  int64_t max_steps() const override { return trainer_->max_steps(); }

  StatusOr<StepRecord> Step() override {
    return Guard<StepRecord>([&] { return trainer_->Step(); });
  }

  StatusOr<Agreement> AgreeFlags(uint32_t flags, uint64_t id) override {
    return Guard<Agreement>([&]() -> StatusOr<Agreement> {
      std::vector<int64_t> bits(kFlagBits, 0);
      for (int b = 0; b < kFlagBits; ++b) bits[b] = (flags >> b) & 1u;
      Comm& comm = trainer_->comm();
      TIDAL_RETURN_IF_ERROR(comm.AllReduceSumHost(bits));
      Agreement agreed;
      for (int b = 0; b < kFlagBits; ++b)
        if (bits[b] > 0) agreed.flags |= 1u << b;
      if (agreed.flags == 0) return agreed;  // the common case: one collective per step
      // Every rank knows now that a request is on: the largest id, one slot per rank (rare).
      std::vector<int64_t> ids(static_cast<size_t>(comm.world_size()), 0);
      ids[static_cast<size_t>(comm.rank())] = static_cast<int64_t>(id);
      TIDAL_RETURN_IF_ERROR(comm.AllReduceSumHost(ids));
      for (int64_t v : ids) agreed.id = std::max(agreed.id, static_cast<uint64_t>(v));
      return agreed;
    });
  }

  Status Start(TrainingHooks& hooks) override {
    return Guard<bool>([&]() -> StatusOr<bool> {
             TIDAL_RETURN_IF_ERROR(hooks.OnStart(*trainer_));
             return true;
           })
        .status();
  }
  Status After(TrainingHooks& hooks) override {
    return Guard<bool>([&]() -> StatusOr<bool> {
             TIDAL_RETURN_IF_ERROR(hooks.AfterStep(*trainer_));
             return true;
           })
        .status();
  }
  Status Finish(TrainingHooks& hooks) override {
    return Guard<bool>([&]() -> StatusOr<bool> {
             TIDAL_RETURN_IF_ERROR(hooks.OnFinish(*trainer_));
             return true;
           })
        .status();
  }
  StatusOr<std::string> CheckpointNow(TrainingHooks& hooks) override {
    return Guard<std::string>([&] { return hooks.CheckpointNow(*trainer_); });
  }
  StatusOr<std::string> CheckpointLive(TrainingHooks& hooks) override {
    return Guard<std::string>([&] { return hooks.CheckpointLive(*trainer_); });
  }
  StatusOr<std::function<StatusOr<uint64_t>()>> CheckpointBuddy(TrainingHooks& hooks) override {
    return Guard<std::function<StatusOr<uint64_t>()>>(
        [&] { return hooks.CheckpointBuddy(*trainer_); });
  }

  uint64_t FrozenChecksum() const override { return trainer_->parameters().FrozenChecksum(); }

  Status WriteSummary(const RunSummary& run, const std::string& out_dir) override {
    return Guard<bool>([&]() -> StatusOr<bool> {
             std::error_code ec;
             std::filesystem::create_directories(out_dir, ec);
             if (ec) return Unavailable("--out: cannot create " + out_dir + ": " + ec.message());
             auto& params = trainer_->parameters();
             // Collective: every rank takes part, rank 0 writes.
             TIDAL_ASSIGN_OR_RETURN(auto adapters, params.GatherTrainable());
             nlohmann::json summary = {
                 {"rank", membership_.rank},
                 {"world_size", membership_.world_size},
                 {"zero_stage", params.options().stage},
                 {"steps", trainer_->step()},
                 {"losses", run.losses},
                 {"resident_param_bytes", params.ResidentParameterBytes()},
                 {"total_param_bytes", params.TotalParameterBytes()},
                 {"largest_block_bytes", params.LargestBlockBytes()},
                 {"optimizer_state_bytes", trainer_->optimizer().StateBytes()},
                 {"trainable_params", params.TrainableParameterCount()},
                 {"base_checksum_before", std::to_string(run.base_checksum_before)},
                 {"base_checksum_after", std::to_string(params.FrozenChecksum())},
                 {"train_seconds", run.train_seconds}};
             TIDAL_RETURN_IF_ERROR(WriteJsonFile(
                 out_dir + "/rank-" + std::to_string(membership_.rank) + ".json", summary));
             if (membership_.rank == 0)
               TIDAL_RETURN_IF_ERROR(WriteSafetensors(out_dir + "/lora_weights.safetensors",
                                                      adapters, {{"format", "pt"}}));
             return true;
           })
        .status();
  }

 private:
  template <typename T, typename F>
  StatusOr<T> Guard(F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      const std::string msg = FirstLine(e.what());
      return Unavailable("rank " + std::to_string(membership_.rank) + " of generation " +
                         std::to_string(membership_.generation) + ": " + msg);
    }
  }

  Membership membership_;
  TrainConfig config_;
  std::unique_ptr<StoreServer> store_;  // rank 0 only
  std::unique_ptr<Trainer> trainer_;
  bool usable_ = true;
};

}  // namespace

namespace {

// Join's and Prepare's common start: the arguments checked, the thread count set, then the
// engine built (in the group, or planned for it).
StatusOr<std::unique_ptr<Session>> BuildSession(const TrainConfig& config,
                                                const Membership& membership,
                                                const SessionOptions& options, bool planned) {
  if (membership.world_size < 1 || membership.rank < 0 || membership.rank >= membership.world_size)
    return InvalidArgument("rank " + std::to_string(membership.rank) + " is outside world size " +
                           std::to_string(membership.world_size));
  TIDAL_RETURN_IF_ERROR(config.ValidateForWorldSize(membership.world_size));
  const int cores = numa::UsableCpus();  // a cpuset or NUMA binding: only those
  torch::set_num_threads(options.intra_op_threads > 0 ? options.intra_op_threads : cores);
  std::unique_ptr<StoreServer> store;
  if (!planned && membership.rank == 0 && membership.world_size > 1 &&
      membership.rank0_hosts_store) {
    TIDAL_ASSIGN_OR_RETURN(store, StoreServer::Start(membership.store_host, membership.store_port));
  }
  auto session = std::make_unique<TrainerSession>(membership, config, std::move(store));
  const auto start = std::chrono::steady_clock::now();
  try {
    TIDAL_RETURN_IF_ERROR(planned ? session->BuildPlanned(config, options)
                                  : session->Build(config, options));
  } catch (const std::exception& e) {
    const std::string msg = FirstLine(e.what());
    return Unavailable("rank " + std::to_string(membership.rank) +
                       (planned ? " could not prepare its engine for generation "
                                : " could not start generation ") +
                       std::to_string(membership.generation) + ": " + msg);
  }
  if (planned)
    LogInfo("engine prepared",
            {{"planned_rank", membership.rank},
             {"planned_world_size", membership.world_size},
             {"seconds",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
  return std::unique_ptr<Session>(std::move(session));
}

}  // namespace

StatusOr<std::unique_ptr<Session>> Session::Join(const TrainConfig& config,
                                                 const Membership& membership,
                                                 const SessionOptions& options) {
  return BuildSession(config, membership, options, /*planned=*/false);
}

StatusOr<std::unique_ptr<Session>> Session::Prepare(const TrainConfig& config,
                                                    const Membership& planned,
                                                    const SessionOptions& options) {
  return BuildSession(config, planned, options, /*planned=*/true);
}

}  // namespace tidal::engine
