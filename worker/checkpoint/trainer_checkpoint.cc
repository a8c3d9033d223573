// worker/checkpoint/trainer_checkpoint.cc
#include "worker/checkpoint/trainer_checkpoint.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include <torch/torch.h>

#include "common/log.h"
#include "worker/checkpoint/peft_export.h"
#include "worker/engine/trainer.h"
#include "worker/objstore/memory_store.h"

namespace tidal::checkpoint {
namespace {

using engine::TrainableBlockLayout;
using engine::Trainer;
using nlohmann::json;

constexpr const char* kExpAvg = "optimizer.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.exp_avg_sq.";
// Gradient compression's residual of group g: "optimizer.residual.<g>." + parameter name, at
// the parameter's shape (under "optimizer.", which the adapter export leaves out, as it does the
// moments). Saved in full checkpoints by the rank holding the group; a resume reads the groups
// it holds now, at any world size.
std::string ResidualName(int64_t group, const std::string& param) {
  return "optimizer.residual." + std::to_string(group) + "." + param;
}

std::string NowRfc3339() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

AdapterInfo AdapterInfoOf(const engine::Trainer& trainer) {
  const engine::TrainConfig& c = trainer.config();
  return {c.lora.rank,       c.lora.alpha,
          c.lora.dropout,    c.lora.target_modules,
          c.model.uri,       c.model.preset,
          c.model.init_seed, trainer.model().config().moe.n_routed_experts};
}

std::string_view Bytes(const torch::Tensor& t) {
  return {static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * 4};
}

// Every rank learns whether every rank succeeded (a failed rank still takes part).
Status AgreeOk(engine::Comm& comm, const Status& mine, const std::string& what) {
  std::vector<int64_t> failed{mine.ok() ? 0 : 1};
  TIDAL_RETURN_IF_ERROR(comm.AllReduceSumHost(failed));
  if (!mine.ok()) return mine;
  if (failed[0] > 0) return Aborted(what + ": " + std::to_string(failed[0]) + " rank(s) failed");
  return OkStatus();
}

json ShardJson(const BuiltShard& shard) {
  json pieces = json::array();
  for (const auto& [t, p] : shard.pieces)
    pieces.push_back({{"tensor", t.name},
                      {"dtype", t.dtype},
                      {"shape", t.shape},
                      {"offset", p.offset},
                      {"first", p.first},
                      {"count", p.count},
                      {"chunks", p.chunks}});
  return {{"file", shard.entry.file},
          {"size", shard.entry.size},
          {"xxh3", shard.entry.xxh3},
          {"chunkBytes", shard.chunk_bytes},
          {"pieces", pieces}};
}

BuiltShard ShardFromJson(const json& j) {
  BuiltShard shard;
  shard.entry = {j["file"], j["size"], j["xxh3"]};
  shard.chunk_bytes = j["chunkBytes"];
  for (const json& p : j["pieces"]) {
    TensorEntry t;
    t.name = p["tensor"];
    t.dtype = p["dtype"];
    t.shape = p["shape"].get<std::vector<int64_t>>();
    PieceEntry e;
    e.offset = p["offset"];
    e.first = p["first"];
    e.count = p["count"];
    e.chunks = p["chunks"].get<std::vector<std::string>>();
    shard.pieces.emplace_back(std::move(t), std::move(e));
  }
  return shard;
}

// This rank's pieces: for each block, its owned 1/W cut at parameter boundaries.
struct OwnedPiece {
  const TrainableBlockLayout* block;
  const engine::FlatParamLayout* param;
  int64_t lo, hi;  // flat element range
};
std::vector<OwnedPiece> OwnedPieces(const std::vector<TrainableBlockLayout>& layout) {
  std::vector<OwnedPiece> out;
  for (const TrainableBlockLayout& b : layout)
    for (const engine::FlatParamLayout& p : b.params) {
      int64_t lo = std::max(b.owned_lo, p.offset), hi = std::min(b.owned_hi, p.offset + p.numel);
      if (lo < hi) out.push_back({&b, &p, lo, hi});
    }
  return out;
}

// The reads that fill `dest` (fp32, covering flat elements [lo, hi) of block `b`) from the
// checkpoint's per-parameter tensors named prefix + parameter name. Padding stays zero.
void PlanFlatRange(const TrainableBlockLayout& b, const std::string& prefix, int64_t lo, int64_t hi,
                   torch::Tensor& dest, std::vector<Repository::TensorRead>& reads) {
  for (const engine::FlatParamLayout& p : b.params) {
    int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (a >= e) continue;
    reads.push_back(
        {prefix + p.name, a - p.offset, e - a, static_cast<char*>(dest.data_ptr()) + (a - lo) * 4});
  }
}

// Gradient compression's residuals for the groups this rank holds. Saved at another group count
// (the default follows the world size), group g's residual goes to group g × now / then, so
// that their sum — the gradient not yet sent — is kept whole; the curve from there is then a
// run at the new count's, which the warning says.
Status LoadResiduals(Trainer& trainer, Repository& repo, const Manifest& manifest,
                     const json& state) {
  auto& params = trainer.parameters();
  const int64_t groups = params.compression_groups();
  if (groups == 0) return OkStatus();
  const auto layout = params.TrainableLayout();
  int64_t saved = 0;
  if (auto it = state.find("compressionGroups"); it != state.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      return DataLoss("trainer_state.json: compressionGroups: expected an integer >= 0");
    saved = it->get<int64_t>();
  }
  const std::string where = repo.store().uri() + "/" + StepDirectory(manifest.step);
  // Whatever an earlier attempt (a newer checkpoint that failed to load) left is dropped.
  params.ClearResiduals();
  if (saved == 0 || layout.empty() ||
      manifest.Find(ResidualName(0, layout[0].params[0].name)) == nullptr) {
    Logger::Get().Log("warn",
                      "resuming without gradient compression residuals: they start from zero",
                      {{"checkpoint", where}, {"kind", KindName(manifest.kind)}});
    return OkStatus();
  }
  if (saved != groups)
    Logger::Get().Log("warn",
                      "gradient compression groups changed: residuals regrouped with their sum "
                      "kept, the curve from here is the new count's",
                      {{"checkpoint", where}, {"saved_groups", saved}, {"groups", groups}});
  const int64_t first = params.first_group();
  for (int64_t j = first; j < first + params.local_groups(); ++j) {
    std::vector<torch::Tensor> sums, parts;
    std::vector<Repository::TensorRead> reads;
    for (const TrainableBlockLayout& b : layout) sums.push_back(torch::zeros({b.numel}));
    for (int64_t g = 0; g < saved; ++g) {
      if (g * groups / saved != j) continue;
      for (const TrainableBlockLayout& b : layout) {
        parts.push_back(torch::zeros({b.numel}));
        for (const engine::FlatParamLayout& p : b.params)
          reads.push_back({ResidualName(g, p.name), 0, p.numel,
                           static_cast<char*>(parts.back().data_ptr()) + p.offset * 4});
      }
    }
    TIDAL_RETURN_IF_ERROR(repo.ReadTensorsInto(manifest, reads));
    for (size_t i = 0; i < parts.size(); ++i) sums[i % layout.size()] += parts[i];
    for (size_t i = 0; i < layout.size(); ++i)
      TIDAL_RETURN_IF_ERROR(params.SetResidual(layout[i].block, j, sums[i]));
  }
  return OkStatus();
}

Status LoadStep(Trainer& trainer, Repository& repo, int64_t step) {
  TIDAL_ASSIGN_OR_RETURN(Manifest manifest, repo.ReadManifest(step));
  if (manifest.config_hash != ConfigHash(trainer.config()))
    return FailedPrecondition(repo.store().uri() + "/" + StepDirectory(step) +
                              " was saved for another model, LoRA, data or batch configuration");
  for (const TensorEntry& t : manifest.tensors)
    if (t.dtype != "F32")
      return DataLoss(t.name + ": expected F32 in the checkpoint, found " + t.dtype);
  auto& params = trainer.parameters();
  const auto layout = params.TrainableLayout();
  // Weights: every element this rank holds, read in one batch.
  std::vector<torch::Tensor> held;
  std::vector<Repository::TensorRead> reads;
  for (const TrainableBlockLayout& b : layout) {
    held.push_back(torch::zeros({b.held_hi - b.held_lo}, torch::kFloat32));
    PlanFlatRange(b, "", b.held_lo, b.held_hi, held.back(), reads);
  }
  TIDAL_RETURN_IF_ERROR(repo.ReadTensorsInto(manifest, reads));
  for (size_t i = 0; i < layout.size(); ++i)
    TIDAL_RETURN_IF_ERROR(params.SetTrainableHeld(layout[i].block, held[i]));
  TIDAL_ASSIGN_OR_RETURN(json state, repo.ReadTrainerState(step));
  TIDAL_RETURN_IF_ERROR(trainer.RestoreState(state));
  // Optimizer moments over the range this rank updates, when the checkpoint has them.
  bool has_moments = manifest.kind == CheckpointKind::kFull && !layout.empty() &&
                     manifest.Find(kExpAvg + layout[0].params[0].name) != nullptr;
  if (!has_moments) {
    trainer.parameters().ClearResiduals();
    if (trainer.parameters().compression_groups() > 0)
      Logger::Get().Log("warn",
                        "resuming without gradient compression residuals: they start from zero",
                        {{"checkpoint", repo.store().uri() + "/" + StepDirectory(step)},
                         {"kind", KindName(manifest.kind)}});
    trainer.optimizer().Reset();
    Logger::Get().Log("warn", "resuming without optimizer state: AdamW moments start from zero",
                      {{"checkpoint", repo.store().uri() + "/" + StepDirectory(step)},
                       {"kind", KindName(manifest.kind)}});
    return OkStatus();
  }
  const auto& adamw = trainer.optimizer().options();
  std::vector<engine::ShardedAdamW::State> states(layout.size());
  reads.clear();
  for (size_t i = 0; i < layout.size(); ++i) {
    const TrainableBlockLayout& b = layout[i];
    engine::ShardedAdamW::State& st = states[i];
    st.exp_avg = torch::zeros({b.optimizer_hi - b.optimizer_lo}, torch::kFloat32);
    st.exp_avg_sq = torch::zeros({b.optimizer_hi - b.optimizer_lo}, torch::kFloat32);
    PlanFlatRange(b, kExpAvg, b.optimizer_lo, b.optimizer_hi, st.exp_avg, reads);
    PlanFlatRange(b, kExpAvgSq, b.optimizer_lo, b.optimizer_hi, st.exp_avg_sq, reads);
  }
  TIDAL_RETURN_IF_ERROR(repo.ReadTensorsInto(manifest, reads));
  std::map<std::string, engine::ShardedAdamW::State> moments;
  for (size_t i = 0; i < layout.size(); ++i) {
    engine::ShardedAdamW::State& st = states[i];
    if (!adamw.offload_to_cpu) {
      auto device = params.options().device;
      st.exp_avg = st.exp_avg.to(device);
      st.exp_avg_sq = st.exp_avg_sq.to(device);
    }
    moments[layout[i].key] = std::move(st);
  }
  const json* steps = state.contains("optimizerSteps") ? &state["optimizerSteps"] : nullptr;
  if (!steps || !steps->is_number_integer())
    return DataLoss("trainer_state.json: optimizerSteps: expected an integer");
  trainer.optimizer().Restore(std::move(moments), steps->get<int64_t>());
  return LoadResiduals(trainer, repo, manifest, state);
}

// Phase 1, on the training thread at the step boundary: this rank's pieces copied to host
// memory (the only part that must stop training).
struct SaveCapture {
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  int rank = 0, world_size = 1, zero_stage = 0;
  std::string config_hash;
  std::chrono::steady_clock::time_point start;
  std::vector<torch::Tensor> tensors;  // own the bytes `pieces` point into (their storage)
  std::vector<PieceData> pieces;
  std::optional<json> trainer_state;  // rank 0 only
};

StatusOr<SaveCapture> CaptureForSave(Trainer& trainer, CheckpointKind kind) {
  SaveCapture c;
  c.step = trainer.step();
  c.kind = kind;
  c.rank = trainer.comm().rank();
  c.world_size = trainer.comm().world_size();
  c.zero_stage = trainer.parameters().options().stage;
  c.config_hash = ConfigHash(trainer.config());
  c.start = std::chrono::steady_clock::now();
  auto& params = trainer.parameters();
  const auto layout = params.TrainableLayout();
  for (const OwnedPiece& o : OwnedPieces(layout)) {
    TIDAL_ASSIGN_OR_RETURN(torch::Tensor weights,
                           params.TrainableRange(o.block->block, o.lo, o.hi));
    c.tensors.push_back(weights);
    c.pieces.push_back(
        {o.param->name, "F32", o.param->shape, o.lo - o.param->offset, Bytes(c.tensors.back())});
    if (kind != CheckpointKind::kFull) continue;
    const auto& state = trainer.optimizer().state();
    auto it = state.find(o.block->key);
    if (it == state.end()) continue;  // no step taken yet: no moments to save
    for (const auto& [prefix, moment] :
         {std::pair{kExpAvg, it->second.exp_avg}, std::pair{kExpAvgSq, it->second.exp_avg_sq}}) {
      c.tensors.push_back(moment.detach()
                              .narrow(0, o.lo - o.block->optimizer_lo, o.hi - o.lo)
                              .to(torch::kCPU, torch::kFloat32, false, /*copy=*/true));
      c.pieces.push_back({prefix + o.param->name, "F32", o.param->shape, o.lo - o.param->offset,
                          Bytes(c.tensors.back())});
    }
  }
  // Gradient compression's residuals, whole, for each group this rank holds (full only, as the
  // moments: a snapshot resumes without either).
  if (kind == CheckpointKind::kFull && params.compression_groups() > 0)
    for (int64_t g = params.first_group(); g < params.first_group() + params.local_groups(); ++g)
      for (const TrainableBlockLayout& b : layout) {
        TIDAL_ASSIGN_OR_RETURN(torch::Tensor residual, params.Residual(b.block, g));
        for (const engine::FlatParamLayout& p : b.params) {
          c.tensors.push_back(residual.narrow(0, p.offset, p.numel));
          c.pieces.push_back({ResidualName(g, p.name), "F32", p.shape, 0, Bytes(c.tensors.back())});
        }
      }
  if (c.rank == 0) {
    json state = trainer.StateJson();
    state["kind"] = KindName(kind);
    state["compressionGroups"] = params.compression_groups();
    state["adapter"] = AdapterInfoJson(AdapterInfoOf(trainer));
    c.trainer_state = std::move(state);
  }
  return c;
}

// Phase 2, on any thread: the shard built and written, durable on return.
StatusOr<BuiltShard> WriteCapture(Repository& repo, const SaveCapture& c) {
  TIDAL_ASSIGN_OR_RETURN(BuiltShard shard, BuildShard(c.rank, c.world_size, c.pieces));
  TIDAL_RETURN_IF_ERROR(repo.WriteShard(c.step, shard));
  if (c.trainer_state) TIDAL_RETURN_IF_ERROR(repo.WriteTrainerState(c.step, *c.trainer_state));
  return shard;
}

// Phase 3, collective, on the training thread: every rank's write succeeded, or nothing is
// committed; rank 0 gathers the shard entries, commits (manifest, then latest) and prunes.
// `spread`: every rank's shard went to a store of its own (SaveToPeers): rank 0 writes the
// manifest only (Repository::CommitSpread) and prunes nothing.
Status CommitSave(Trainer& trainer, Repository& repo, const SaveCapture& c,
                  const StatusOr<BuiltShard>& shard, int keep, bool spread = false) {
  engine::Comm& comm = trainer.comm();
  TIDAL_RETURN_IF_ERROR(
      AgreeOk(comm, shard.status(), repo.store().uri() + "/" + StepDirectory(c.step)));
  TIDAL_ASSIGN_OR_RETURN(std::vector<std::string> entries,
                         comm.AllGatherStrings(ShardJson(*shard).dump()));
  Status committed = OkStatus();
  if (comm.rank() == 0) {
    std::vector<BuiltShard> shards;
    for (const std::string& e : entries) shards.push_back(ShardFromJson(json::parse(e)));
    Manifest header;
    header.step = c.step;
    header.kind = c.kind;
    header.world_size = c.world_size;
    header.zero_stage = c.zero_stage;
    header.config_hash = c.config_hash;
    header.created_at = NowRfc3339();
    auto manifest = AssembleManifest(header, shards);
    committed = !manifest.ok() ? manifest.status()
                : spread       ? repo.CommitSpread(*manifest)
                               : repo.Commit(*manifest);
    if (committed.ok()) {
      auto pruned =
          spread ? StatusOr<std::vector<int64_t>>(std::vector<int64_t>{}) : repo.Prune(keep);
      if (!pruned.ok())  // the checkpoint is committed; a failed prune only costs space
        Logger::Get().Log("warn", "pruning old checkpoints failed",
                          {{"error", pruned.status().message()}});
      uint64_t bytes = 0;
      for (const BuiltShard& s : shards) bytes += s.entry.size;
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
      Logger::Get().Log("info", "checkpoint committed",
                        {{"checkpoint", repo.store().uri() + "/" + StepDirectory(c.step)},
                         {"kind", KindName(c.kind)},
                         {"committed_at_step", trainer.step()},
                         {"bytes", bytes},
                         {"seconds", seconds},
                         {"bytes_per_s", seconds > 0 ? bytes / seconds : 0.0}});
    }
  }
  return AgreeOk(comm, committed, "committing checkpoint step " + std::to_string(c.step));
}

// Saves asynchronously: at a due step the pieces are copied to host memory and a thread
// builds and writes the shard while training goes on; at each later step boundary the ranks
// ask each other whether every write is done, and once it is, commit it. At most one save is
// in flight (bounded memory): a due save first waits for the previous write to finish.
class CheckpointHooks : public engine::TrainingHooks {
 public:
  // `store` (where saves go) or `resume_store` may be null.
  CheckpointHooks(CheckpointPolicy policy, std::unique_ptr<objstore::ObjectStore> store,
                  std::unique_ptr<objstore::ObjectStore> resume_store)
      : policy_(std::move(policy)),
        store_(std::move(store)),
        resume_store_(std::move(resume_store)) {
    if (store_) {
      repo_.emplace(*store_);
      repo_->SetGeneration(policy_.generation);
    }
  }
  void SetStartFrom(std::unique_ptr<objstore::ObjectStore> store) {
    start_from_store_ = std::move(store);
  }
  ~CheckpointHooks() override {
    if (in_flight_ && in_flight_->thread.joinable()) in_flight_->thread.join();
  }

  Status OnStart(Trainer& trainer) override {
    if (repo_ && !policy_.owner.uid.empty()) {
      const Status claimed = trainer.comm().rank() == 0 ? repo_->Claim(policy_.owner) : OkStatus();
      TIDAL_RETURN_IF_ERROR(AgreeOk(trainer.comm(), claimed, "claiming the checkpoint store"));
    }
    TIDAL_RETURN_IF_ERROR(Resume(trainer));
    if (repo_ && policy_.generation > 0) {
      const Status fenced = trainer.comm().rank() == 0 ? repo_->Fence() : OkStatus();
      TIDAL_RETURN_IF_ERROR(AgreeOk(trainer.comm(), fenced, "raising the checkpoint fence"));
    }
    if (resumed_) {
      // `latest` named a corrupt checkpoint the resume skipped: it names the one resumed now
      // (a failure to write it only leaves the hint stale; the scan is the truth).
      if (resumed_own_ && !resumed_->corrupt.empty() && trainer.comm().rank() == 0)
        if (Status s = repo_->PointLatestAt(resumed_->step); !s.ok())
          Logger::Get().Log("warn", "could not point latest at the resumed checkpoint",
                            {{"step", resumed_->step}, {"error", s.message()}});
      if (policy_.on_resume) policy_.on_resume(*resumed_);
    }
    if (!policy_.auto_full) return OkStatus();
    // What the checkpoint resumed from measured; the first checkpoint of a job measures it.
    const json& carried = trainer.extensions();
    auto cost = carried.find(kCostExtension);
    cost_seconds_ = cost != carried.end() && cost->is_number() ? cost->get<double>() : 0;
    return PlanInterval(trainer, trainer.step());
  }

  // What checkpointing costs the training thread, per save: the host copy, the commit
  // rounds and any wait for the previous write, logged at each commit (bench/checkpoint_stall.sh).
  // With the automatic interval, a periodic full checkpoint's cost from the step it was due at
  // to its commit is C, and its commit plans the next interval.
  Status AfterStep(Trainer& trainer) override {
    const auto start = std::chrono::steady_clock::now();
    const bool full_pending = FullInFlight();
    committed_full_ = -1;
    Status status = SaveIfDue(trainer);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    blocked_seconds_ += elapsed;
    if (!policy_.auto_full || !status.ok()) return status;
    if (full_pending || FullInFlight() || committed_full_ >= 0) full_cost_ += elapsed;
    if (committed_full_ < 0) {
      // A barrier (CheckpointNow, CheckpointLive) committed the pending one between two steps
      // and the generation trains on (a Resume after a pause): plan from it, measuring nothing.
      if (next_full_ != kFullPending || FullInFlight()) return OkStatus();
      full_cost_ = 0;
      return PlanInterval(trainer, std::max<int64_t>(last_full_, 0));
    }
    // A moving average: one slow store round does not swing the interval alone.
    cost_seconds_ = cost_seconds_ > 0 ? 0.5 * cost_seconds_ + 0.5 * full_cost_ : full_cost_;
    full_cost_ = 0;
    trainer.extensions()[kCostExtension] = cost_seconds_;
    return PlanInterval(trainer, committed_full_);
  }

  Status SaveIfDue(Trainer& trainer) {
    if (!repo_) return OkStatus();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/false));
    const int64_t step = trainer.step();
    if (step >= trainer.max_steps() && policy_.save_final) return OkStatus();  // OnFinish saves
    std::optional<CheckpointKind> kind;
    if (FullDue(step))
      kind = CheckpointKind::kFull;
    else if (policy_.snapshot_every > 0 && step % policy_.snapshot_every == 0)
      kind = CheckpointKind::kSnapshot;
    if (!kind) return OkStatus();
    // The automatic interval: no other full checkpoint is due until this one's commit plans
    // the next (AfterStep).
    if (policy_.auto_full && *kind == CheckpointKind::kFull) next_full_ = kFullPending;
    if (!policy_.async) return Save(trainer, *kind).status();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    auto job = std::make_unique<InFlight>();
    auto capture = CaptureForSave(trainer, *kind);
    if (!capture.ok()) {  // still take part in the commit round, so every rank agrees
      job->capture.step = step;
      job->capture.kind = *kind;
      job->shard = capture.status();
      job->done = true;
    } else {
      job->capture = std::move(*capture);
      InFlight* raw = job.get();
      job->thread = std::thread([this, raw] {
        raw->shard = WriteCapture(*repo_, raw->capture);
        raw->done = true;
      });
    }
    in_flight_ = std::move(job);
    return OkStatus();
  }
  Status OnFinish(Trainer& trainer) override {
    if (!repo_) return OkStatus();
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    if (!policy_.save_final) return OkStatus();
    TIDAL_RETURN_IF_ERROR(Save(trainer, CheckpointKind::kFull).status());
    if (!policy_.export_final || trainer.comm().rank() != 0) return OkStatus();
    // DESIGN.md §5: the final adapter in PEFT's layout, next to the checkpoints.
    auto exported = ExportPeftAdapter(*repo_, trainer.step(), *store_, kFinalExportPrefix);
    if (!exported.ok()) return exported.status().WithContext("final PEFT export");
    LogInfo("exported the final adapter", {{"uri", store_->uri() + "/" + kFinalExportPrefix},
                                           {"step", exported->step},
                                           {"tensors", exported->tensors},
                                           {"bytes", exported->bytes}});
    return OkStatus();
  }

  StatusOr<std::string> CheckpointLive(Trainer& trainer) override {
    if (!policy_.live_store) return FailedPrecondition("no memory store for live checkpoints");
    // A save still in flight is committed first: its round belongs to this generation.
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    return SaveToPeers(trainer, *policy_.live_store);
  }

  StatusOr<std::function<StatusOr<uint64_t>()>> CheckpointBuddy(Trainer& trainer) override {
    if (!policy_.live_store) return FailedPrecondition("no memory store for buddy copies");
    return CaptureBuddyCopy(trainer, *policy_.live_store);
  }

  StatusOr<std::string> CheckpointNow(Trainer& trainer) override {
    if (!repo_) return FailedPrecondition("no checkpoint URI to save into");
    if (in_flight_) TIDAL_RETURN_IF_ERROR(Finish(trainer, /*wait=*/true));
    if (last_full_ == trainer.step())  // the save just committed is this very step
      return repo_->store().uri() + "/" + StepDirectory(trainer.step());
    return Save(trainer, CheckpointKind::kFull);
  }

 private:
  // The trainer-state extension that carries C across restarts and rescales.
  static constexpr const char* kCostExtension = "checkpointCostSeconds";
  // next_full_ while a full checkpoint of the automatic interval is on its way to its commit.
  static constexpr int64_t kFullPending = std::numeric_limits<int64_t>::max();

  bool FullInFlight() const {
    return in_flight_ && in_flight_->capture.kind == CheckpointKind::kFull;
  }
  bool FullDue(int64_t step) const {
    if (policy_.auto_full) return next_full_ > 0 && step >= next_full_;
    return policy_.full_every > 0 && step % policy_.full_every == 0;
  }

  // Collective: rank 0 plans, every rank takes its plan; the next full checkpoint is due that
  // many steps after `from_step` (the one just committed, or the resumed step), at the next
  // step boundary when that is already past (its commit came later than that).
  Status PlanInterval(Trainer& trainer, int64_t from_step) {
    api::IntervalInputs in;
    in.spec = *policy_.auto_full;
    in.cost_seconds = cost_seconds_;
    // The step time since the last plan (a rescale changes it), else the run's mean.
    const int64_t steps = trainer.step() - planned_at_step_;
    const double seconds = trainer.trained_seconds() - planned_at_trained_;
    in.step_seconds = planned_at_step_ >= 0 && steps > 0 ? seconds / static_cast<double>(steps)
                      : trainer.step() > 0
                          ? trainer.trained_seconds() / static_cast<double>(trainer.step())
                          : 0;
    in.failures = policy_.failures;
    in.trained_seconds = trainer.trained_seconds();
    api::IntervalPlan plan = api::PlanCheckpointInterval(in);
    const bool root = trainer.comm().rank() == 0;
    std::vector<double> agreed = {static_cast<double>(plan.steps),
                                  static_cast<double>(plan.reason),
                                  in.cost_seconds,
                                  in.step_seconds,
                                  in.trained_seconds,
                                  plan.mtbf_seconds,
                                  plan.optimum_seconds,
                                  plan.expected_waste};
    if (!root) std::fill(agreed.begin(), agreed.end(), 0.0);
    TIDAL_RETURN_IF_ERROR(trainer.comm().AllReduceSumHost(agreed));
    plan.steps = static_cast<int64_t>(agreed[0]);
    plan.reason = static_cast<api::IntervalPlan::Reason>(static_cast<int>(agreed[1]));
    in.cost_seconds = agreed[2];
    in.step_seconds = agreed[3];
    in.trained_seconds = agreed[4];
    plan.mtbf_seconds = agreed[5];
    plan.optimum_seconds = agreed[6];
    plan.expected_waste = agreed[7];
    next_full_ = from_step + plan.steps;
    planned_at_step_ = trainer.step();
    planned_at_trained_ = trainer.trained_seconds();
    if (root)
      Logger::Get().Log("info", "checkpoint interval planned",
                        {{"full_every_steps", plan.steps},
                         {"reason", api::ReasonName(plan.reason)},
                         {"next_full_step", next_full_},
                         {"planned_at_step", trainer.step()},
                         {"cost_seconds", in.cost_seconds},
                         {"step_seconds", in.step_seconds},
                         {"mtbf_seconds", plan.mtbf_seconds},
                         {"failures", in.failures},
                         {"trained_seconds", in.trained_seconds},
                         {"expected_waste_percent", 100 * plan.expected_waste}});
    if (policy_.on_interval) policy_.on_interval(in, plan);
    return OkStatus();
  }

  Status Resume(Trainer& trainer) {
    if (resume_store_) {  // asked for by name: it must hold a checkpoint
      Repository from(*resume_store_);
      auto step = ResumeFromNewest(trainer, from);
      if (step.status().code() == StatusCode::kNotFound)
        return NotFound("--resume " + resume_store_->uri() + ": no usable checkpoint there");
      return step.status();
    }
    bool peers_failed = false;
    if (policy_.peer_resume_step > 0) {
      Status live = ResumeFromPeers(trainer, policy_.peer_resume.get(), policy_.peer_resume_step);
      if (live.ok()) return OkStatus();
      // Some rank could not read its part (a peer is gone): every rank knows it (AgreeOk), and
      // the trainer holds a mix of read and initial values, which the store's newest
      // checkpoint overwrites whole.
      peers_failed = true;
      if (trainer.comm().rank() == 0)
        Logger::Get().Log("warn", "live reshard failed, resuming from the store",
                          {{"peers", policy_.peer_resume ? policy_.peer_resume->uri() : ""},
                           {"step", policy_.peer_resume_step},
                           {"error", live.message()}});
    }
    if (!policy_.resume || !repo_) {
      if (peers_failed)
        return Unavailable("the peers' state could not be read and no store to resume from");
      return OkStatus();
    }
    ResumeReport report;
    auto step = ResumeFromNewest(trainer, *repo_, &report);
    if (step.ok()) {
      resumed_ = std::move(report);
      return OkStatus();
    }
    if (step.status().code() == StatusCode::kNotFound) {
      // Starting at step 0 is right for a new job, never over a half-read state.
      if (peers_failed)
        return Unavailable("the peers' state could not be read and " + repo_->store().uri() +
                           " holds no checkpoint to resume from");
      if (start_from_store_) {  // a new job started from another's checkpoints
        Repository from(*start_from_store_);
        auto started = ResumeFromNewest(trainer, from, &report);
        if (started.status().code() == StatusCode::kNotFound)
          return NotFound("spec.checkpoint.resumeFrom: " + start_from_store_->uri() +
                          " holds no usable checkpoint");
        if (!started.ok())
          return started.status().WithContext("spec.checkpoint.resumeFrom " +
                                              start_from_store_->uri());
        if (trainer.comm().rank() == 0)
          LogInfo("started from another job's checkpoint",
                  {{"resume_from", start_from_store_->uri()}, {"step", *started}});
        resumed_ = std::move(report);
        resumed_own_ = false;
        return OkStatus();
      }
      return OkStatus();
    }
    return step.status();
  }
  StatusOr<std::string> Save(Trainer& trainer, CheckpointKind kind) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    auto uri = SaveCheckpoint(trainer, *repo_, kind, policy_.keep, &bytes);
    if (!uri.ok()) {
      Failed(kind, uri.status());
      return uri.status();
    }
    Committed(trainer.step(), kind, start, bytes);
    return uri;
  }
  void Committed(int64_t step, CheckpointKind kind, std::chrono::steady_clock::time_point start,
                 uint64_t shard_bytes) {
    if (kind == CheckpointKind::kFull) last_full_ = committed_full_ = step;
    if (!policy_.on_commit) return;
    CommitInfo info;
    info.step = step;
    info.kind = kind;
    info.uri = repo_->store().uri() + "/" + StepDirectory(step);
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    info.shard_bytes = shard_bytes;
    policy_.on_commit(info);
  }
  void Failed(CheckpointKind kind, const Status& why) {
    if (policy_.on_failure) policy_.on_failure(kind, why);
  }

  struct InFlight {
    SaveCapture capture;
    StatusOr<BuiltShard> shard = Aborted("not written yet");
    std::atomic<bool> done{false};
    std::thread thread;
  };

  // Commits the in-flight save once every rank's write is done (collective: every rank calls
  // it at the same steps). With `wait`, waits for this rank's write first.
  Status Finish(Trainer& trainer, bool wait) {
    if (wait && in_flight_->thread.joinable()) in_flight_->thread.join();
    std::vector<int64_t> pending{in_flight_->done ? 0 : 1};
    TIDAL_RETURN_IF_ERROR(trainer.comm().AllReduceSumHost(pending));
    if (pending[0] > 0) return OkStatus();  // some rank still writing: next step
    if (in_flight_->thread.joinable()) in_flight_->thread.join();
    std::unique_ptr<InFlight> job = std::move(in_flight_);
    Status committed = CommitSave(trainer, *repo_, job->capture, job->shard, policy_.keep);
    if (committed.ok())
      Committed(job->capture.step, job->capture.kind, job->capture.start,
                job->shard.ok() ? job->shard->entry.size : 0);
    else
      Failed(job->capture.kind, committed);
    if (committed.ok()) {
      Logger::Get().Log(
          "info", "checkpoint stall",
          {{"step", job->capture.step}, {"training_thread_seconds", blocked_seconds_}});
      blocked_seconds_ = 0;
    }
    return committed;
  }

  CheckpointPolicy policy_;
  std::unique_ptr<objstore::ObjectStore> store_, resume_store_;
  std::unique_ptr<objstore::ObjectStore> start_from_store_;  // policy_.start_from_uri's
  std::optional<ResumeReport> resumed_;  // this generation's resume from a store, if any
  bool resumed_own_ = true;              // from store_ (not start_from_store_)
  std::optional<Repository> repo_;
  std::unique_ptr<InFlight> in_flight_;
  double blocked_seconds_ = 0;  // in AfterStep since the last commit
  int64_t last_full_ = -1;      // step of the newest full checkpoint this object committed
  // The automatic interval (policy_.auto_full).
  int64_t committed_full_ = -1;   // a full checkpoint this AfterStep committed, of that step
  int64_t next_full_ = 0;         // the step the next full checkpoint is due at (0: none yet)
  double cost_seconds_ = 0;       // C: this rank's moving average (rank 0's is the job's)
  double full_cost_ = 0;          // AfterStep's time while a full checkpoint was pending
  int64_t planned_at_step_ = -1;  // where the last plan measured the step time up to
  double planned_at_trained_ = 0;
};

}  // namespace

std::string ConfigHash(const engine::TrainConfig& c) {
  json identity = {
      {"model", {{"preset", c.model.preset}, {"uri", c.model.uri}}},
      {"lora",
       {{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", c.lora.target_modules}}},
      {"data", {{"uri", c.dataset.uri}, {"maxSeqLen", c.dataset.max_seq_len}}},
      {"globalBatchSize", c.optimization.global_batch_size},
      {"seed", c.optimization.seed}};
  return Xxh3Hex(identity.dump());
}

StatusOr<std::string> SaveCheckpoint(Trainer& trainer, Repository& repo, CheckpointKind kind,
                                     int keep, uint64_t* shard_bytes) {
  auto capture = CaptureForSave(trainer, kind);
  StatusOr<BuiltShard> shard = capture.ok() ? WriteCapture(repo, *capture) : capture.status();
  if (shard_bytes) *shard_bytes = shard.ok() ? shard->entry.size : 0;
  SaveCapture failed;  // a rank that could not copy still takes part in the agreement
  failed.step = trainer.step();
  TIDAL_RETURN_IF_ERROR(CommitSave(trainer, repo, capture.ok() ? *capture : failed, shard, keep));
  return repo.store().uri() + "/" + StepDirectory(trainer.step());
}

StatusOr<std::string> SaveToPeers(Trainer& trainer, objstore::MemoryStore& memory) {
  memory.Clear();  // one checkpoint at a time: the previous generation's, if any, goes
  Repository repo(memory);
  auto capture = CaptureForSave(trainer, CheckpointKind::kFull);
  StatusOr<BuiltShard> shard = capture.ok() ? WriteCapture(repo, *capture) : capture.status();
  SaveCapture failed;
  failed.step = trainer.step();
  TIDAL_RETURN_IF_ERROR(CommitSave(trainer, repo, capture.ok() ? *capture : failed, shard,
                                   /*keep=*/1, /*spread=*/true));
  return memory.uri() + "/" + StepDirectory(trainer.step());
}

std::string BuddyPartName(int rank, int world_size) {
  char name[48];
  std::snprintf(name, sizeof(name), "part-%05d-of-%05d.json", rank + 1, world_size);
  return name;
}

StatusOr<std::function<StatusOr<uint64_t>()>> CaptureBuddyCopy(Trainer& trainer,
                                                               objstore::MemoryStore& memory) {
  TIDAL_ASSIGN_OR_RETURN(SaveCapture captured, CaptureForSave(trainer, CheckpointKind::kFull));
  auto c = std::make_shared<SaveCapture>(std::move(captured));
  return std::function<StatusOr<uint64_t>()>([c, &memory]() -> StatusOr<uint64_t> {
    Repository repo(memory);
    TIDAL_ASSIGN_OR_RETURN(BuiltShard shard, WriteCapture(repo, *c));
    json part = ShardJson(shard);
    part["step"] = c->step;
    part["worldSize"] = c->world_size;
    part["zeroStage"] = c->zero_stage;
    part["configHash"] = c->config_hash;
    TIDAL_RETURN_IF_ERROR(memory.Put(
        StepDirectory(c->step) + "/" + BuddyPartName(c->rank, c->world_size), part.dump()));
    return shard.entry.size;
  });
}

namespace {

// `base` with one more object: the manifest a buddy copy's step has none of, assembled from its
// parts (read-only).
class WithManifest final : public objstore::ObjectStore {
 public:
  WithManifest(objstore::ObjectStore& base, std::string key, std::string manifest)
      : base_(base), key_(std::move(key)), manifest_(std::move(manifest)) {}
  std::string uri() const override { return base_.uri(); }
  Status Put(const std::string& key, std::string_view) override {
    return FailedPrecondition(uri() + ": read-only (" + key + ")");
  }
  StatusOr<std::string> Get(const std::string& key) override {
    return key == key_ ? StatusOr<std::string>(manifest_) : base_.Get(key);
  }
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset,
                                 uint64_t length) override {
    if (key != key_) return base_.GetRange(key, offset, length);
    if (offset > manifest_.size() || length > manifest_.size() - offset)
      return InvalidArgument(key + ": range past the end");
    return manifest_.substr(offset, length);
  }
  StatusOr<uint64_t> Size(const std::string& key) override {
    return key == key_ ? StatusOr<uint64_t>(manifest_.size()) : base_.Size(key);
  }
  StatusOr<std::vector<objstore::ObjectInfo>> List(const std::string& prefix) override {
    return base_.List(prefix);
  }
  Status Delete(const std::vector<std::string>&) override {
    return FailedPrecondition(uri() + ": read-only");
  }

 private:
  objstore::ObjectStore& base_;
  const std::string key_, manifest_;
};

// The manifest of a buddy copy's `step`, from its W parts (W from the trainer state of rank 0's
// part); each part must be of the step and the world size.
StatusOr<std::string> AssembleBuddyManifest(objstore::ObjectStore& peers, int64_t step) {
  const std::string dir = StepDirectory(step) + "/";
  TIDAL_ASSIGN_OR_RETURN(std::string state_text, peers.Get(dir + "trainer_state.json"));
  const json state = json::parse(state_text, nullptr, false);
  if (!state.is_object() || !state.contains("worldSize") || !state["worldSize"].is_number_integer())
    return DataLoss(peers.uri() + "/" + dir + "trainer_state.json: worldSize: expected an integer");
  const int world_size = state["worldSize"].get<int>();
  if (world_size < 1) return DataLoss(dir + "trainer_state.json: worldSize < 1");
  std::vector<BuiltShard> shards;
  Manifest header;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string name = dir + BuddyPartName(rank, world_size);
    TIDAL_ASSIGN_OR_RETURN(std::string text, peers.Get(name));
    const json part = json::parse(text, nullptr, false);
    if (!part.is_object() || part.value("step", int64_t{-1}) != step ||
        part.value("worldSize", 0) != world_size)
      return DataLoss(peers.uri() + "/" + name + ": not a part of step " + std::to_string(step) +
                      " at " + std::to_string(world_size) + " ranks");
    try {
      shards.push_back(ShardFromJson(part));
    } catch (const json::exception& e) {
      return DataLoss(peers.uri() + "/" + name + ": " + e.what());
    }
    if (rank == 0) {
      header.zero_stage = part.value("zeroStage", 0);
      header.config_hash = part.value("configHash", "");
    } else if (part.value("configHash", "") != header.config_hash) {
      return DataLoss(peers.uri() + "/" + name + ": of another configuration than part 1");
    }
  }
  header.step = step;
  header.kind = CheckpointKind::kFull;
  header.world_size = world_size;
  header.created_at = NowRfc3339();
  TIDAL_ASSIGN_OR_RETURN(Manifest manifest, AssembleManifest(header, shards));
  return ToJson(manifest).dump();
}

}  // namespace

Status ResumeFromPeers(Trainer& trainer, objstore::ObjectStore* peers, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  Status loaded = Unavailable("this rank cannot reach the peers");
  if (peers) {
    // A live checkpoint has its manifest; a buddy copy's is assembled from its parts.
    std::unique_ptr<WithManifest> assembled;
    const std::string manifest_key = StepDirectory(step) + "/manifest.json";
    loaded = OkStatus();
    if (peers->Size(manifest_key).status().code() == StatusCode::kNotFound) {
      auto manifest = AssembleBuddyManifest(*peers, step);
      if (manifest.ok())
        assembled = std::make_unique<WithManifest>(*peers, manifest_key, std::move(*manifest));
      else
        loaded = manifest.status();
    }
    if (loaded.ok()) {
      Repository repo(assembled ? static_cast<objstore::ObjectStore&>(*assembled) : *peers);
      loaded = LoadStep(trainer, repo, step);
    }
    if (loaded.ok() && trainer.step() != step)
      loaded = DataLoss(peers->uri() + ": the state of step " + std::to_string(step) +
                        " says step " + std::to_string(trainer.step()));
  }
  TIDAL_RETURN_IF_ERROR(
      AgreeOk(trainer.comm(), loaded, "resuming from the peers' step " + std::to_string(step)));
  if (trainer.comm().rank() == 0)
    Logger::Get().Log(
        "info", "resumed from peers",
        {{"peers", peers->uri()},
         {"step", step},
         {"world_size", trainer.comm().world_size()},
         {"seconds",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
  return OkStatus();
}

StatusOr<int64_t> ResumeFromNewest(Trainer& trainer, Repository& repo, ResumeReport* report) {
  engine::Comm& comm = trainer.comm();
  std::set<int64_t> bad;
  std::vector<std::string> corrupt;
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::vector<int64_t> chosen{-1};
    std::optional<CheckpointKind> kind;
    if (comm.rank() == 0) {
      auto newest = repo.NewestUsable(bad, &corrupt);
      if (newest.ok()) {
        chosen[0] = newest->step;
        kind = newest->kind;
      }
    }
    TIDAL_RETURN_IF_ERROR(comm.BroadcastHost(chosen, 0));
    const int64_t step = chosen[0];
    if (step < 0) return NotFound("no usable checkpoint in " + repo.store().uri());
    Status loaded = LoadStep(trainer, repo, step);
    Status agreed = AgreeOk(comm, loaded, "resuming from step " + std::to_string(step));
    if (agreed.ok()) {
      if (comm.rank() == 0)
        Logger::Get().Log("info", "resumed",
                          {{"checkpoint", repo.store().uri() + "/" + StepDirectory(step)},
                           {"world_size", comm.world_size()},
                           {"zero_stage", trainer.parameters().options().stage},
                           {"skipped_corrupt", corrupt}});
      if (report) {
        report->step = step;
        // Rank 0 read the kind from the manifest; the others read it again (one small GET).
        if (!kind) {
          auto manifest = repo.ReadManifest(step);
          if (manifest.ok()) kind = manifest->kind;
        }
        report->kind = kind.value_or(CheckpointKind::kFull);
        report->uri = repo.store().uri() + "/" + StepDirectory(step);
        report->corrupt = corrupt;
      }
      return step;
    }
    Logger::Get().Log("warn", "checkpoint unusable, trying the previous one",
                      {{"checkpoint", repo.store().uri() + "/" + StepDirectory(step)},
                       {"error", agreed.message()}});
    if (loaded.code() == StatusCode::kFailedPrecondition) return loaded;  // another config
    // A read the store failed now (on this rank) is no corruption, though the step is skipped.
    if (loaded.code() != StatusCode::kUnavailable && loaded.code() != StatusCode::kDeadlineExceeded)
      corrupt.push_back(StepDirectory(step) + ": " + agreed.message());
    bad.insert(step);
  }
  return DataLoss("no readable checkpoint in " + repo.store().uri() + " after 8 attempts");
}

StatusOr<std::unique_ptr<engine::TrainingHooks>> MakeCheckpointHooks(
    CheckpointPolicy policy, const objstore::S3Options& s3) {
  if (policy.full_every < 0 || policy.snapshot_every < 0)
    return InvalidArgument("checkpoint intervals: expected >= 0");
  if (policy.keep < 1) return InvalidArgument("--keep: expected at least 1");
  if (policy.auto_full) {
    const api::AutoIntervalSpec& a = *policy.auto_full;
    if (a.min_steps < 1 || a.max_steps < a.min_steps)
      return InvalidArgument(
          "automatic checkpoint interval: expected 1 <= minFullEverySteps <= "
          "maxFullEverySteps, got " +
          std::to_string(a.min_steps) + " and " + std::to_string(a.max_steps));
    if (!(a.expected_mtbf_seconds > 0))
      return InvalidArgument("automatic checkpoint interval: expectedMTBF: expected > 0");
    if (policy.failures < 0) return InvalidArgument("restarts: expected >= 0");
  }
  if (policy.uri.empty() && policy.resume_uri.empty())
    return InvalidArgument("checkpoints: expected a checkpoint URI or a URI to resume from");
  std::unique_ptr<objstore::ObjectStore> store, resume_store;
  if (!policy.uri.empty()) {
    TIDAL_ASSIGN_OR_RETURN(store, objstore::OpenObjectStore(policy.uri, s3));
  }
  if (!policy.resume_uri.empty()) {
    auto opened = objstore::OpenObjectStore(policy.resume_uri, s3);
    if (!opened.ok()) return opened.status().WithContext("--resume");
    resume_store = std::move(*opened);
  }
  std::unique_ptr<objstore::ObjectStore> start_from;
  if (!policy.start_from_uri.empty()) {
    auto opened = objstore::OpenObjectStore(policy.start_from_uri, s3);
    if (!opened.ok()) return opened.status().WithContext("spec.checkpoint.resumeFrom");
    start_from = std::move(*opened);
  }
  auto hooks = std::make_unique<CheckpointHooks>(std::move(policy), std::move(store),
                                                 std::move(resume_store));
  hooks->SetStartFrom(std::move(start_from));
  return std::unique_ptr<engine::TrainingHooks>(std::move(hooks));
}

}  // namespace tidal::checkpoint
