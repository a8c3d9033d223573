// worker/checkpoint/buddy_copy.cc — a rank's buddy copy (its part of a step kept in a peer's
// memory, DESIGN.md §4 step 5), and a resume from the parts the peers hold (the previous
// generation's live checkpoint, or the buddy copies of a step).
#include <cstdio>

#include "common/log.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/checkpoint/trainer_checkpoint_internal.h"
#include "worker/objstore/memory_store.h"

namespace tidal::checkpoint {

using engine::Trainer;
using nlohmann::json;
using namespace internal;

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

}  // namespace tidal::checkpoint
