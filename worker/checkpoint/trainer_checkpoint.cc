// worker/checkpoint/trainer_checkpoint.cc — a trainer's state saved (captured at the step
// boundary, written, committed by every rank together) and resumed (the newest intact store
// checkpoint). The hooks that save on schedule: checkpoint_hooks.cc; buddy copies and the
// resume from the peers' memory: buddy_copy.cc.
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
#include "worker/checkpoint/trainer_checkpoint_internal.h"
#include "worker/engine/trainer.h"
#include "worker/objstore/memory_store.h"

namespace tidal::checkpoint {

using engine::TrainableBlockLayout;
using engine::Trainer;
using nlohmann::json;

// What this file's functions share with checkpoint_hooks.cc and buddy_copy.cc
// (trainer_checkpoint_internal.h), and what they keep to themselves.
namespace internal {

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

StatusOr<BuiltShard> WriteCapture(Repository& repo, const SaveCapture& c) {
  TIDAL_ASSIGN_OR_RETURN(BuiltShard shard, BuildShard(c.rank, c.world_size, c.pieces));
  TIDAL_RETURN_IF_ERROR(repo.WriteShard(c.step, shard));
  if (c.trainer_state) TIDAL_RETURN_IF_ERROR(repo.WriteTrainerState(c.step, *c.trainer_state));
  return shard;
}

Status CommitSave(Trainer& trainer, Repository& repo, const SaveCapture& c,
                  const StatusOr<BuiltShard>& shard, int keep, bool spread) {
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

}  // namespace internal

using namespace internal;

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

namespace {

// What a rank holds before a resume's first attempt: its generation's initial state (every
// generation's trainer starts at step 0 with the initial adapter weights, Trainer::
// StartGeneration). A load that fails on one rank may have been read whole by the others, or
// in part by that one; when no checkpoint is left to try, every rank goes back to this, so that
// the generation starts at step 0 as a new job does, never from a mix of steps.
struct InitialState {
  nlohmann::json trainer;
  std::vector<std::pair<int64_t, torch::Tensor>> held;  // block → its held trainable range
};

StatusOr<InitialState> CaptureInitialState(Trainer& trainer) {
  InitialState initial;
  initial.trainer = trainer.StateJson();
  for (const TrainableBlockLayout& b : trainer.parameters().TrainableLayout()) {
    TIDAL_ASSIGN_OR_RETURN(torch::Tensor held,
                           trainer.parameters().TrainableRange(b.block, b.held_lo, b.held_hi));
    initial.held.emplace_back(b.block, std::move(held));
  }
  return initial;
}

Status RestoreInitialState(Trainer& trainer, const InitialState& initial) {
  for (const auto& [block, held] : initial.held)
    TIDAL_RETURN_IF_ERROR(trainer.parameters().SetTrainableHeld(block, held));
  TIDAL_RETURN_IF_ERROR(trainer.RestoreState(initial.trainer));
  trainer.optimizer().Reset();
  trainer.parameters().ClearResiduals();
  return OkStatus();
}

}  // namespace

StatusOr<int64_t> ResumeFromNewest(Trainer& trainer, Repository& repo, ResumeReport* report) {
  engine::Comm& comm = trainer.comm();
  std::set<int64_t> bad;
  std::vector<std::string> corrupt;
  std::optional<InitialState> initial;  // taken before the first load
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
    if (step < 0) {
      if (initial) {  // a load was tried: the ranks hold what each read of it
        TIDAL_RETURN_IF_ERROR(RestoreInitialState(trainer, *initial));
        if (comm.rank() == 0)
          Logger::Get().Log("warn", "no usable checkpoint left: starting over from step 0",
                            {{"store", repo.store().uri()}, {"skipped_corrupt", corrupt}});
      }
      return NotFound("no usable checkpoint in " + repo.store().uri());
    }
    Status loaded;
    if (!initial) {  // a failure here is agreed on as a failed load is
      StatusOr<InitialState> taken = CaptureInitialState(trainer);
      if (taken.ok())
        initial = std::move(*taken);
      else
        loaded = taken.status();
    }
    if (loaded.ok()) loaded = LoadStep(trainer, repo, step);
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

}  // namespace tidal::checkpoint
