// worker/checkpoint/repository.cc
#include "worker/checkpoint/repository.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "common/log.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

constexpr uint64_t kRequestBytes = 1 << 20;  // most bytes one read request asks for
constexpr uint64_t kMaxGap = 256 << 10;      // unwanted bytes read to join two requests

std::string Key(int64_t step, const std::string& file) { return StepDirectory(step) + "/" + file; }

constexpr const char* kFenceObject = "fence";
constexpr const char* kOwnerObject = "owner";

}  // namespace

Status Repository::WriteShard(int64_t step, const BuiltShard& shard) {
  Status s = store_.PutParts(Key(step, shard.entry.file), shard.Parts());
  if (!s.ok())
    return Status(s.code(), "writing " + Key(step, shard.entry.file) + ": " + s.message());
  return OkStatus();
}

Status Repository::WriteTrainerState(int64_t step, const json& state) {
  return store_.Put(Key(step, "trainer_state.json"), state.dump(2) + "\n");
}

StatusOr<int64_t> Repository::ReadFence() {
  auto text = store_.Get(kFenceObject);
  if (text.status().code() == StatusCode::kNotFound) return int64_t{0};
  if (!text.ok()) return text.status().WithContext("reading " + store_.uri() + "/" + kFenceObject);
  int64_t fence = 0;
  const std::string& t = *text;
  auto end = t.find_last_not_of(" \r\n");
  auto [ptr, ec] =
      std::from_chars(t.data(), t.data() + (end == std::string::npos ? 0 : end + 1), fence);
  if (ec != std::errc() || ptr != t.data() + end + 1 || fence < 0)
    return DataLoss(store_.uri() + "/" + kFenceObject + ": expected a generation number, got \"" +
                    t.substr(0, 40) + "\"");
  return fence;
}

Status Repository::Claim(const StoreOwner& owner) {
  if (owner.uid.empty()) return OkStatus();
  const std::string where = store_.uri() + "/" + kOwnerObject;
  auto text = store_.Get(kOwnerObject);
  if (text.status().code() == StatusCode::kNotFound)
    return store_.Put(
        kOwnerObject,
        json{{"uid", owner.uid}, {"namespace", owner.namespace_}, {"name", owner.name}}.dump() +
            "\n");
  if (!text.ok()) return text.status().WithContext("reading " + where);
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("uid") || !j["uid"].is_string())
    return DataLoss(where + ": expected {\"uid\": ..., \"namespace\": ..., \"name\": ...}");
  const std::string uid = j["uid"];
  if (uid == owner.uid) return OkStatus();
  const std::string other = j.value("namespace", "?") + "/" + j.value("name", "?");
  return FailedPrecondition(
      "spec.checkpoint.uri: " + store_.uri() + " holds the checkpoints of job " + other + " (uid " +
      uid + "), not of this job (uid " + owner.uid +
      "): a job never resumes or overwrites another's. To start from them, set "
      "spec.checkpoint.resumeFrom: " +
      store_.uri() + " and give this job a store of its own (another spec.checkpoint.uri)");
}

Status Repository::Fence() {
  if (generation_ <= 0) return OkStatus();
  TIDAL_ASSIGN_OR_RETURN(int64_t fence, ReadFence());
  if (fence > generation_)
    return FailedPrecondition("superseded: generation " + std::to_string(fence) +
                              " of this job has started, so generation " +
                              std::to_string(generation_) + " may not write to " + store_.uri());
  if (fence == generation_) return OkStatus();
  return store_.Put(kFenceObject, std::to_string(generation_) + "\n");
}

Status Repository::Commit(const Manifest& manifest) {
  std::string dir = StepDirectory(manifest.step);
  TIDAL_ASSIGN_OR_RETURN(std::vector<objstore::ObjectInfo> present, store_.List(dir + "/"));
  std::map<std::string, uint64_t> sizes;
  for (const objstore::ObjectInfo& o : present) sizes[o.key] = o.size;
  for (const ShardEntry& shard : manifest.shards) {
    auto it = sizes.find(Key(manifest.step, shard.file));
    if (it == sizes.end())
      return FailedPrecondition("not committing " + dir + ": " + shard.file + " is missing");
    if (it->second != shard.size)
      return FailedPrecondition("not committing " + dir + ": " + shard.file + " has " +
                                std::to_string(it->second) + " bytes, expected " +
                                std::to_string(shard.size));
  }
  TIDAL_RETURN_IF_ERROR(Fence());
  Manifest stamped = manifest;
  stamped.generation = generation_;
  TIDAL_RETURN_IF_ERROR(CommitSpread(stamped));
  return PointLatestAt(manifest.step);
}

Status Repository::CommitSpread(const Manifest& manifest) {
  return store_.Put(Key(manifest.step, "manifest.json"), ToJson(manifest).dump() + "\n");
}

StatusOr<std::vector<ScannedCheckpoint>> Repository::Scan() {
  TIDAL_ASSIGN_OR_RETURN(std::vector<objstore::ObjectInfo> objects, store_.List("step-"));
  // step → (file → size)
  std::map<int64_t, std::map<std::string, uint64_t>, std::greater<>> dirs;
  for (const objstore::ObjectInfo& o : objects) {
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

Status Repository::PointLatestAt(int64_t step) {
  return store_.Put("latest", StepDirectory(step) + "\n");
}

StatusOr<Manifest> Repository::NewestUsable(const std::set<int64_t>& exclude,
                                            std::vector<std::string>* corrupt) {
  TIDAL_ASSIGN_OR_RETURN(std::vector<ScannedCheckpoint> scanned, Scan());
  for (ScannedCheckpoint& c : scanned) {
    if (exclude.count(c.step)) continue;
    if (c.manifest) return std::move(*c.manifest);
    // Not corrupt: a save never committed (torn), or a manifest the store failed to serve now.
    if (corrupt && c.problem.rfind("no manifest.json", 0) != 0 &&
        c.problem.rfind("manifest.json unreadable", 0) != 0)
      corrupt->push_back(StepDirectory(c.step) + ": " + c.problem);
    Logger::Get().Log(
        "warn", "skipping checkpoint",
        {{"checkpoint", store_.uri() + "/" + StepDirectory(c.step)}, {"reason", c.problem}});
  }
  return NotFound("no usable checkpoint in " + store_.uri());
}

StatusOr<std::string> Repository::ReadTensor(const Manifest& manifest, const std::string& tensor,
                                             int64_t first, int64_t count) {
  const TensorEntry* t = manifest.Find(tensor);
  if (!t) return NotFound(StepDirectory(manifest.step) + ": no tensor \"" + tensor + "\"");
  auto size = DtypeSize(t->dtype);
  if (!size || count < 0) return InvalidArgument(tensor + ": bad dtype or count");
  std::string out(static_cast<size_t>(count) * static_cast<size_t>(*size), '\0');
  TIDAL_RETURN_IF_ERROR(ReadTensorInto(manifest, tensor, first, count, out.data()));
  return out;
}

Status Repository::ReadTensorInto(const Manifest& manifest, const std::string& tensor,
                                  int64_t first, int64_t count, char* dest) {
  return ReadTensorsInto(manifest, {{tensor, first, count, dest}}, 1);
}

namespace {

// One stretch of a shard file and where its bytes go. Chunks wholly inside the wanted bytes go
// straight to their destination and are verified there; a chunk a wanted range cuts goes to a
// scratch buffer, is verified, and its wanted part copied. Stretches of one file that follow
// each other are read together (one preadv on file://, one GET on s3://), so a rank reading its
// slice of many small tensors makes few large requests and moves each byte once.
struct Stretch {
  const ReadRange* range;
  uint64_t begin, end;  // byte range within the range's fetched span, whole chunks
  char* direct;         // destination when the stretch is wanted whole, else null (scratch)
  char* copy_to;        // for scratch stretches: where the wanted part goes…
  uint64_t copy_from, copy_length;  // …and which part of the stretch that is
  uint64_t file_offset() const { return range->fetch_offset + begin; }
};

void PlanStretches(const ReadRange& r, char* out, std::vector<Stretch>& stretches) {
  const uint64_t c = r.chunk_bytes, want_end = r.skip + r.length;
  auto chunk_end = [&](uint64_t i) { return std::min((i + 1) * c, r.fetch_length); };
  auto partial = [&](uint64_t i) {
    const uint64_t begin = i * c, end = chunk_end(i);
    const uint64_t from = std::max(begin, r.skip), to = std::min(end, want_end);
    stretches.push_back({&r, begin, end, nullptr, out + (from - r.skip), from - begin, to - from});
  };
  // Whole chunks [lo, hi) of the fetched span lie inside the wanted bytes.
  const uint64_t lo = (r.skip + c - 1) / c;
  uint64_t hi = want_end / c;
  if (want_end == r.fetch_length) hi = (r.fetch_length + c - 1) / c;  // short final chunk
  if (lo >= hi) {
    for (uint64_t i = r.skip / c; i * c < want_end; ++i) partial(i);
    return;
  }
  if (r.skip < lo * c) partial(lo - 1);
  const uint64_t per_request = std::max<uint64_t>(1, kRequestBytes / c);  // chunks
  for (uint64_t i = lo; i < hi; i += per_request) {
    const uint64_t begin = i * c, end = chunk_end(std::min(hi, i + per_request) - 1);
    stretches.push_back({&r, begin, end, out + (begin - r.skip), nullptr, 0, 0});
  }
  if (hi * c < want_end) partial(hi);
}

}  // namespace

Status Repository::ReadTensorsInto(const Manifest& manifest, const std::vector<TensorRead>& reads,
                                   int parallel) {
  // Plan: every range of every read, cut into stretches, sorted by file and offset.
  std::vector<ReadRange> ranges;
  std::vector<char*> outs;
  for (const TensorRead& read : reads) {
    TIDAL_ASSIGN_OR_RETURN(std::vector<ReadRange> planned,
                           PlanRead(manifest, read.tensor, read.first, read.count));
    const size_t size = static_cast<size_t>(*DtypeSize(manifest.Find(read.tensor)->dtype));
    for (ReadRange& r : planned) {
      outs.push_back(read.dest + static_cast<size_t>(r.dest_first) * size);
      ranges.push_back(std::move(r));
    }
  }
  std::vector<Stretch> stretches;
  for (size_t i = 0; i < ranges.size(); ++i) PlanStretches(ranges[i], outs[i], stretches);
  std::sort(stretches.begin(), stretches.end(), [](const Stretch& a, const Stretch& b) {
    return std::tie(a.range->file, a.range->fetch_offset, a.begin) <
           std::tie(b.range->file, b.range->fetch_offset, b.begin);
  });
  // Requests: runs of adjacent stretches of one file, up to kRequestBytes (overlapping ones,
  // two reads cutting the same chunk, start a new request).
  std::vector<std::pair<size_t, size_t>> requests;  // [first, last) stretch
  for (size_t i = 0; i < stretches.size(); ++i) {
    if (!requests.empty()) {
      const Stretch& prev = stretches[i - 1];
      const Stretch& head = stretches[requests.back().first];
      const Stretch& s = stretches[i];
      const uint64_t prev_end = prev.file_offset() + (prev.end - prev.begin);
      if (s.range->file == prev.range->file && s.file_offset() >= prev_end &&
          s.file_offset() - prev_end <= kMaxGap &&
          s.file_offset() + (s.end - s.begin) - head.file_offset() <= kRequestBytes) {
        requests.back().second = i + 1;
        continue;
      }
    }
    requests.emplace_back(i, i + 1);
  }

  const std::string where = store_.uri() + "/" + StepDirectory(manifest.step) + "/";
  auto run = [&](const std::pair<size_t, size_t>& request, std::string& scratch,
                 std::string& gap_buffer) -> Status {
    uint64_t scratch_bytes = 0;
    for (size_t i = request.first; i < request.second; ++i)
      if (!stretches[i].direct) scratch_bytes += stretches[i].end - stretches[i].begin;
    scratch.resize(scratch_bytes);
    std::vector<objstore::ObjectStore::Span> spans;
    std::vector<char*> at;
    uint64_t used = 0;
    for (size_t i = request.first; i < request.second; ++i) {
      const Stretch& s = stretches[i];
      if (i > request.first) {  // bytes between two stretches are read and dropped
        const Stretch& prev = stretches[i - 1];
        const uint64_t gap = s.file_offset() - (prev.file_offset() + (prev.end - prev.begin));
        if (gap > 0) {
          if (gap_buffer.size() < gap) gap_buffer.resize(kMaxGap);  // only once a gap occurs
          spans.push_back({gap_buffer.data(), gap});
        }
      }
      char* to = s.direct ? s.direct : scratch.data() + used;
      if (!s.direct) used += s.end - s.begin;
      spans.push_back({to, s.end - s.begin});
      at.push_back(to);
    }
    const Stretch& head = stretches[request.first];
    TIDAL_RETURN_IF_ERROR(
        store_.GetRangeScatter(Key(manifest.step, head.range->file), head.file_offset(), spans));
    for (size_t i = request.first; i < request.second; ++i) {
      const Stretch& s = stretches[i];
      const char* bytes = at[i - request.first];
      Status verified = VerifyChunks(*s.range, s.begin / s.range->chunk_bytes,
                                     std::string_view(bytes, s.end - s.begin));
      if (!verified.ok()) return DataLoss(where + verified.message());
      if (!s.direct) std::memcpy(s.copy_to, bytes + s.copy_from, s.copy_length);
    }
    return OkStatus();
  };

  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    std::string scratch, gap_buffer;
    for (size_t i = next++; i < requests.size(); i = next++) {
      Status s = run(requests[i], scratch, gap_buffer);
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok() ||
          (s.code() == StatusCode::kDataLoss && first_error.code() != StatusCode::kDataLoss))
        first_error = s;
      next = requests.size();  // hand out no more work
    }
  };
  const size_t threads = std::min<size_t>(std::max(parallel, 1), requests.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return first_error;
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
  TIDAL_ASSIGN_OR_RETURN(std::vector<objstore::ObjectInfo> objects,
                         store_.List(StepDirectory(step) + "/"));
  std::vector<std::string> keys;
  // The manifest first: a half-deleted checkpoint must read as uncommitted, never as whole.
  for (const objstore::ObjectInfo& o : objects)
    if (o.key == Key(step, "manifest.json")) TIDAL_RETURN_IF_ERROR(store_.Delete({o.key}));
  for (const objstore::ObjectInfo& o : objects)
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
