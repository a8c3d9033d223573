// worker/checkpoint/repository.cc
#include "worker/checkpoint/repository.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/log.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

std::string Key(int64_t step, const std::string& file) { return StepDirectory(step) + "/" + file; }

}  // namespace

Status Repository::WriteShard(int64_t step, const BuiltShard& shard) {
  Status s = store_.Put(Key(step, shard.entry.file), shard.bytes);
  if (!s.ok())
    return Status(s.code(), "writing " + Key(step, shard.entry.file) + ": " + s.message());
  return OkStatus();
}

Status Repository::WriteTrainerState(int64_t step, const json& state) {
  return store_.Put(Key(step, "trainer_state.json"), state.dump(2) + "\n");
}

Status Repository::Commit(const Manifest& manifest) {
  std::string dir = StepDirectory(manifest.step);
  TIDAL_ASSIGN_OR_RETURN(std::vector<ObjectInfo> present, store_.List(dir + "/"));
  std::map<std::string, uint64_t> sizes;
  for (const ObjectInfo& o : present) sizes[o.key] = o.size;
  for (const ShardEntry& shard : manifest.shards) {
    auto it = sizes.find(Key(manifest.step, shard.file));
    if (it == sizes.end())
      return FailedPrecondition("not committing " + dir + ": " + shard.file + " is missing");
    if (it->second != shard.size)
      return FailedPrecondition("not committing " + dir + ": " + shard.file + " has " +
                                std::to_string(it->second) + " bytes, expected " +
                                std::to_string(shard.size));
  }
  TIDAL_RETURN_IF_ERROR(
      store_.Put(Key(manifest.step, "manifest.json"), ToJson(manifest).dump() + "\n"));
  return store_.Put("latest", dir + "\n");
}

StatusOr<std::vector<ScannedCheckpoint>> Repository::Scan() {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_.List("step-"));
  // step → (file → size)
  std::map<int64_t, std::map<std::string, uint64_t>, std::greater<>> dirs;
  for (const ObjectInfo& o : objects) {
    auto slash = o.key.find('/');
    if (slash == std::string::npos) continue;
    auto step = ParseStepDirectory(std::string_view(o.key).substr(0, slash));
    if (!step) continue;
    dirs[*step][o.key.substr(slash + 1)] = o.size;
  }
  std::vector<ScannedCheckpoint> out;
  for (const auto& [step, files] : dirs) {
    ScannedCheckpoint c;
    c.step = step;
    if (!files.count("manifest.json")) {
      c.problem = "no manifest.json: never committed (torn save)";
      out.push_back(std::move(c));
      continue;
    }
    auto text = store_.Get(Key(step, "manifest.json"));
    if (!text.ok()) {
      c.problem = "manifest.json unreadable: " + text.status().message();
      out.push_back(std::move(c));
      continue;
    }
    json parsed = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    auto manifest = ManifestFromJson(parsed);
    if (parsed.is_discarded()) manifest = InvalidArgument("not JSON");
    if (!manifest.ok()) {
      c.problem = "manifest.json invalid: " + manifest.status().message();
    } else if (manifest->step != step) {
      c.problem = "manifest.json is for step " + std::to_string(manifest->step);
    } else {
      for (const ShardEntry& shard : manifest->shards) {
        auto it = files.find(shard.file);
        if (it == files.end()) {
          c.problem = shard.file + " is missing";
          break;
        }
        if (it->second != shard.size) {
          c.problem = shard.file + " has " + std::to_string(it->second) + " bytes, expected " +
                      std::to_string(shard.size);
          break;
        }
      }
      if (c.problem.empty()) c.manifest = std::move(*manifest);
    }
    out.push_back(std::move(c));
  }
  return out;
}

StatusOr<Manifest> Repository::NewestUsable(const std::set<int64_t>& exclude) {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ScannedCheckpoint> scanned, Scan());
  for (ScannedCheckpoint& c : scanned) {
    if (exclude.count(c.step)) continue;
    if (c.manifest) return std::move(*c.manifest);
    Logger::Get().Log(
        "warn", "skipping checkpoint",
        {{"checkpoint", store_.uri() + "/" + StepDirectory(c.step)}, {"reason", c.problem}});
  }
  return NotFound("no usable checkpoint in " + store_.uri());
}

StatusOr<std::string> Repository::ReadTensor(const Manifest& manifest, const std::string& tensor,
                                             int64_t first, int64_t count) {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ReadRange> ranges, PlanRead(manifest, tensor, first, count));
  const TensorEntry* t = manifest.Find(tensor);
  size_t size = static_cast<size_t>(*DtypeSize(t->dtype));
  std::string out(static_cast<size_t>(count) * size, '\0');
  for (const ReadRange& r : ranges) {
    std::string key = Key(manifest.step, r.file);
    TIDAL_ASSIGN_OR_RETURN(std::string bytes, store_.GetRange(key, r.fetch_offset, r.fetch_length));
    Status verified = VerifyRange(r, bytes);
    if (!verified.ok())
      return DataLoss(store_.uri() + "/" + StepDirectory(manifest.step) + "/" + verified.message());
    std::memcpy(out.data() + static_cast<size_t>(r.dest_first) * size, bytes.data() + r.skip,
                r.length);
  }
  return out;
}

StatusOr<json> Repository::ReadTrainerState(int64_t step) {
  TIDAL_ASSIGN_OR_RETURN(std::string text, store_.Get(Key(step, "trainer_state.json")));
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    return DataLoss(Key(step, "trainer_state.json") + ": not a JSON object");
  return parsed;
}

StatusOr<Manifest> Repository::ReadManifest(int64_t step) {
  TIDAL_ASSIGN_OR_RETURN(std::string text, store_.Get(Key(step, "manifest.json")));
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return DataLoss(Key(step, "manifest.json") + ": not JSON");
  auto manifest = ManifestFromJson(parsed);
  if (!manifest.ok())
    return DataLoss(Key(step, "manifest.json") + ": " + manifest.status().message());
  return manifest;
}

Status Repository::DeleteStep(int64_t step) {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_.List(StepDirectory(step) + "/"));
  std::vector<std::string> keys;
  // The manifest first: a half-deleted checkpoint must read as uncommitted, never as whole.
  for (const ObjectInfo& o : objects)
    if (o.key == Key(step, "manifest.json")) TIDAL_RETURN_IF_ERROR(store_.Delete({o.key}));
  for (const ObjectInfo& o : objects)
    if (o.key != Key(step, "manifest.json")) keys.push_back(o.key);
  return store_.Delete(keys);
}

StatusOr<std::vector<int64_t>> Repository::Prune(int keep) {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ScannedCheckpoint> scanned, Scan());
  std::map<int64_t, CheckpointKind> committed;
  for (const ScannedCheckpoint& c : scanned)
    if (c.manifest) committed[c.step] = c.manifest->kind;
  std::vector<int64_t> doomed = StepsToPrune(committed, keep);
  if (!committed.empty()) {
    int64_t newest = committed.rbegin()->first;
    for (const ScannedCheckpoint& c : scanned)
      if (!c.manifest && c.step < newest) doomed.push_back(c.step);  // torn or broken, superseded
  }
  std::sort(doomed.begin(), doomed.end());
  for (int64_t step : doomed) TIDAL_RETURN_IF_ERROR(DeleteStep(step));
  return doomed;
}

}  // namespace tidal::checkpoint
