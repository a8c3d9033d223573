// worker/checkpoint/manifest.cc
#include "worker/checkpoint/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "worker/engine/safetensors_header.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

const std::map<std::string, int>& DtypeSizes() {
  static const std::map<std::string, int> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U64", 8}, {"U32", 4}};
  return kSizes;
}

bool IsHex16(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(),
                                       [](char c) { return std::isxdigit(c) && !std::isupper(c); });
}

// `value` as a T, exactly: an integer field takes only a JSON integer within T's range (a
// float such as 6e58 converted by get<T>() is undefined behaviour, and 1.5 would become 1: found
// by fuzz/manifest_fuzz.cc), a list only elements that convert.
template <typename T>
bool Convert(const json& value, T& out) {
  if constexpr (std::is_integral_v<T>) {
    if (!value.is_number_integer()) return false;
    if (value.is_number_unsigned()) {
      const uint64_t v = value.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      out = static_cast<T>(v);
      return true;
    }
    const int64_t v = value.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) return false;
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return false;
    } else {
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<T>::max()))
        return false;
    }
    out = static_cast<T>(v);
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) return false;
    out = value.get<std::string>();
    return true;
  } else {  // a std::vector of one of the above
    if (!value.is_array()) return false;
    T list;
    for (const json& element : value) {
      typename T::value_type item;
      if (!Convert(element, item)) return false;
      list.push_back(std::move(item));
    }
    out = std::move(list);
    return true;
  }
}

// Reads a required field of `type`, naming it on failure.
template <typename T>
Status Require(const json& object, const std::string& path, const char* key, T& out) {
  auto it = object.find(key);
  if (it == object.end()) return InvalidArgument(path + key + ": required");
  if (!Convert(*it, out)) return InvalidArgument(path + key + ": wrong type or out of range");
  return OkStatus();
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* KindName(CheckpointKind kind) {
  return kind == CheckpointKind::kFull ? "full" : "snapshot";
}

const TensorEntry* Manifest::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorEntry& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::optional<int> DtypeSize(const std::string& dtype) {
  auto it = DtypeSizes().find(dtype);
  if (it == DtypeSizes().end()) return std::nullopt;
  return it->second;
}

std::string Xxh3Hex(std::string_view bytes) {
  return HexDigest(XXH3_64bits(bytes.data(), bytes.size()));
}

json ToJson(const Manifest& m) {
  json shards = json::array();
  for (const ShardEntry& s : m.shards)
    shards.push_back({{"file", s.file}, {"size", s.size}, {"xxh3", s.xxh3}});
  json tensors = json::array();
  for (const TensorEntry& t : m.tensors) {
    json pieces = json::array();
    for (const PieceEntry& p : t.pieces)
      pieces.push_back({{"shard", p.shard},
                        {"offset", p.offset},
                        {"first", p.first},
                        {"count", p.count},
                        {"chunks", p.chunks}});
    tensors.push_back(
        {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"pieces", pieces}});
  }
  json out = {{"formatVersion", m.format_version},
              {"step", m.step},
              {"kind", KindName(m.kind)},
              {"worldSize", m.world_size},
              {"zeroStage", m.zero_stage},
              {"configHash", m.config_hash},
              {"createdAt", m.created_at},
              {"chunkBytes", m.chunk_bytes},
              {"shards", shards},
              {"tensors", tensors}};
  if (m.generation > 0) out["generation"] = m.generation;
  return out;
}

StatusOr<Manifest> ManifestFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("manifest: expected a JSON object");
  Manifest m;
  std::string kind;
  TIDAL_RETURN_IF_ERROR(Require(j, "", "formatVersion", m.format_version));
  if (m.format_version != kFormatVersion)
    return InvalidArgument("formatVersion: " + std::to_string(m.format_version) +
                           " is not supported (this build reads " + std::to_string(kFormatVersion) +
                           ")");
  TIDAL_RETURN_IF_ERROR(Require(j, "", "step", m.step));
  TIDAL_RETURN_IF_ERROR(Require(j, "", "kind", kind));
  TIDAL_RETURN_IF_ERROR(Require(j, "", "worldSize", m.world_size));
  TIDAL_RETURN_IF_ERROR(Require(j, "", "zeroStage", m.zero_stage));
  TIDAL_RETURN_IF_ERROR(Require(j, "", "configHash", m.config_hash));
  if (j.contains("createdAt")) TIDAL_RETURN_IF_ERROR(Require(j, "", "createdAt", m.created_at));
  if (j.contains("generation")) TIDAL_RETURN_IF_ERROR(Require(j, "", "generation", m.generation));
  if (m.generation < 0) return InvalidArgument("generation: expected >= 0");
  TIDAL_RETURN_IF_ERROR(Require(j, "", "chunkBytes", m.chunk_bytes));
  if (m.chunk_bytes == 0 || m.chunk_bytes % 8 != 0)
    return InvalidArgument("chunkBytes: expected a positive multiple of 8");
  if (m.step < 0) return InvalidArgument("step: expected >= 0");
  if (kind != "full" && kind != "snapshot")
    return InvalidArgument("kind: expected \"full\" or \"snapshot\", got \"" + kind + "\"");
  m.kind = kind == "full" ? CheckpointKind::kFull : CheckpointKind::kSnapshot;
  if (m.world_size < 1) return InvalidArgument("worldSize: expected >= 1");
  if (m.zero_stage < 0 || m.zero_stage > 3) return InvalidArgument("zeroStage: expected 0-3");
  if (!j.contains("shards") || !j["shards"].is_array())
    return InvalidArgument("shards: expected a list");
  for (size_t i = 0; i < j["shards"].size(); ++i) {
    std::string path = "shards[" + std::to_string(i) + "].";
    ShardEntry s;
    TIDAL_RETURN_IF_ERROR(Require(j["shards"][i], path, "file", s.file));
    TIDAL_RETURN_IF_ERROR(Require(j["shards"][i], path, "size", s.size));
    TIDAL_RETURN_IF_ERROR(Require(j["shards"][i], path, "xxh3", s.xxh3));
    if (s.file.empty() || s.file.find('/') != std::string::npos || s.file[0] == '.')
      return InvalidArgument(path + "file: expected a plain file name, got \"" + s.file + "\"");
    if (!IsHex16(s.xxh3)) return InvalidArgument(path + "xxh3: expected 16 lowercase hex digits");
    m.shards.push_back(s);
  }
  if (!j.contains("tensors") || !j["tensors"].is_array())
    return InvalidArgument("tensors: expected a list");
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    const json& tj = j["tensors"][i];
    std::string path = "tensors[" + std::to_string(i) + "].";
    TensorEntry t;
    TIDAL_RETURN_IF_ERROR(Require(tj, path, "name", t.name));
    TIDAL_RETURN_IF_ERROR(Require(tj, path, "dtype", t.dtype));
    TIDAL_RETURN_IF_ERROR(Require(tj, path, "shape", t.shape));
    if (t.name.empty()) return InvalidArgument(path + "name: required");
    auto size = DtypeSize(t.dtype);
    if (!size) return InvalidArgument(path + "dtype: unknown \"" + t.dtype + "\"");
    for (int64_t d : t.shape)
      if (d < 0) return InvalidArgument(path + "shape: expected non-negative sizes");
    if (!tj.contains("pieces") || !tj["pieces"].is_array())
      return InvalidArgument(path + "pieces: expected a list");
    int64_t covered = 0;
    for (size_t k = 0; k < tj["pieces"].size(); ++k) {
      std::string pp = path + "pieces[" + std::to_string(k) + "].";
      const json& pj = tj["pieces"][k];
      PieceEntry p;
      TIDAL_RETURN_IF_ERROR(Require(pj, pp, "shard", p.shard));
      TIDAL_RETURN_IF_ERROR(Require(pj, pp, "offset", p.offset));
      TIDAL_RETURN_IF_ERROR(Require(pj, pp, "first", p.first));
      TIDAL_RETURN_IF_ERROR(Require(pj, pp, "count", p.count));
      TIDAL_RETURN_IF_ERROR(Require(pj, pp, "chunks", p.chunks));
      if (p.shard < 0 || p.shard >= static_cast<int>(m.shards.size()))
        return InvalidArgument(pp + "shard: no shard " + std::to_string(p.shard));
      if (p.count <= 0) return InvalidArgument(pp + "count: expected > 0");
      if (p.first != covered)
        return InvalidArgument(pp + "first: expected " + std::to_string(covered) +
                               " (pieces must cover the tensor in order, without gaps or overlap)");
      uint64_t end = p.offset + static_cast<uint64_t>(p.count) * static_cast<uint64_t>(*size);
      if (end > m.shards[p.shard].size)
        return InvalidArgument(pp + "offset: the piece ends past its shard (" +
                               std::to_string(end) + " > " +
                               std::to_string(m.shards[p.shard].size) + ")");
      uint64_t piece_bytes = static_cast<uint64_t>(p.count) * static_cast<uint64_t>(*size);
      if (p.chunks.size() != (piece_bytes + m.chunk_bytes - 1) / m.chunk_bytes)
        return InvalidArgument(pp + "chunks: expected one checksum per " +
                               std::to_string(m.chunk_bytes) + " bytes");
      for (const std::string& c : p.chunks)
        if (!IsHex16(c)) return InvalidArgument(pp + "chunks: expected 16 lowercase hex digits");
      covered += p.count;
      t.pieces.push_back(p);
    }
    if (covered != t.numel())
      return InvalidArgument(path + "pieces: cover " + std::to_string(covered) + " of " +
                             std::to_string(t.numel()) + " elements");
    if (!m.tensors.empty() && m.tensors.back().name >= t.name)
      return InvalidArgument(path + "name: tensors must be sorted by name, without repeats");
    m.tensors.push_back(std::move(t));
  }
  return m;
}

std::string StepDirectory(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> ParseStepDirectory(std::string_view name) {
  if (name.size() < 6 || name.substr(0, 5) != "step-") return std::nullopt;
  std::string_view digits = name.substr(5);
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(std::string(digits));
}

std::string ShardFileName(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-of-%05d.safetensors", index + 1, count);
  return buf;
}

StatusOr<BuiltShard> BuildShard(int shard_index, int shard_count,
                                const std::vector<PieceData>& pieces, uint64_t chunk_bytes) {
  // Pieces are stored as 1-D tensors "<tensor>@<first>", back to back.
  std::vector<safetensors::TensorHeader> headers;
  std::vector<uint64_t> relative;
  uint64_t data_size = 0;
  for (const PieceData& p : pieces) {
    auto size = DtypeSize(p.dtype);
    if (!size) return InvalidArgument(p.tensor + ": unknown dtype \"" + p.dtype + "\"");
    if (p.bytes.empty() || p.bytes.size() % static_cast<size_t>(*size) != 0)
      return InvalidArgument(p.tensor + ": " + std::to_string(p.bytes.size()) +
                             " bytes is not a whole, non-zero number of " + p.dtype + " elements");
    const int64_t count = static_cast<int64_t>(p.bytes.size()) / *size;
    headers.push_back({p.tensor + "@" + std::to_string(p.first), p.dtype, {count}, p.bytes.size()});
    relative.push_back(data_size);
    data_size += p.bytes.size();
  }
  if (chunk_bytes == 0 || chunk_bytes % 8 != 0)
    return InvalidArgument("chunk size: expected a positive multiple of 8");
  auto head = safetensors::EncodeHeader(headers, {{"format", "tidal-checkpoint"},
                                                  {"shard", std::to_string(shard_index)},
                                                  {"shards", std::to_string(shard_count)}});
  if (!head.ok()) return head.status().WithContext("shard " + std::to_string(shard_index));
  BuiltShard shard;
  shard.header = std::move(*head);
  const uint64_t data_start = shard.header.size();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> whole(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(whole.get());
  XXH3_64bits_update(whole.get(), shard.header.data(), shard.header.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceData& p = pieces[i];
    shard.data.push_back(p.bytes);
    XXH3_64bits_update(whole.get(), p.bytes.data(), p.bytes.size());
    TensorEntry t;
    t.name = p.tensor;
    t.dtype = p.dtype;
    t.shape = p.shape;
    PieceEntry e;
    e.shard = shard_index;
    e.offset = data_start + relative[i];
    e.first = p.first;
    e.count = static_cast<int64_t>(p.bytes.size()) / *DtypeSize(p.dtype);
    for (uint64_t c = 0; c < p.bytes.size(); c += chunk_bytes)
      e.chunks.push_back(Xxh3Hex(p.bytes.substr(c, chunk_bytes)));
    shard.pieces.emplace_back(std::move(t), e);
  }
  shard.entry = {ShardFileName(shard_index, shard_count), data_start + data_size,
                 HexDigest(XXH3_64bits_digest(whole.get()))};
  shard.chunk_bytes = chunk_bytes;
  return shard;
}

StatusOr<Manifest> AssembleManifest(Manifest header, const std::vector<BuiltShard>& shards) {
  header.shards.clear();
  header.tensors.clear();
  uint64_t chunk_bytes = shards.empty() ? header.chunk_bytes : shards[0].chunk_bytes;
  for (const BuiltShard& s : shards)
    if (s.chunk_bytes != chunk_bytes)
      return InvalidArgument("shards were checksummed in different chunk sizes");
  header.chunk_bytes = chunk_bytes;
  std::map<std::string, TensorEntry> tensors;
  for (size_t i = 0; i < shards.size(); ++i) {
    header.shards.push_back(shards[i].entry);
    for (const auto& [t, piece] : shards[i].pieces) {
      auto [it, inserted] = tensors.emplace(t.name, t);
      if (!inserted && (it->second.dtype != t.dtype || it->second.shape != t.shape))
        return InvalidArgument(t.name + ": shards disagree on its dtype or shape");
      PieceEntry p = piece;
      p.shard = static_cast<int>(i);
      it->second.pieces.push_back(p);
    }
  }
  for (auto& [name, t] : tensors) {
    std::sort(t.pieces.begin(), t.pieces.end(),
              [](const PieceEntry& a, const PieceEntry& b) { return a.first < b.first; });
    header.tensors.push_back(std::move(t));
  }
  // Round trip through the validator: what a reader would refuse is refused here, at save.
  return ManifestFromJson(ToJson(header));
}

StatusOr<std::vector<ReadRange>> PlanRead(const Manifest& manifest, const std::string& tensor,
                                          int64_t first, int64_t count) {
  const TensorEntry* t = manifest.Find(tensor);
  if (!t)
    return NotFound("checkpoint step " + std::to_string(manifest.step) + " has no tensor " +
                    tensor);
  if (first < 0 || count < 0 || first + count > t->numel())
    return InvalidArgument(tensor + ": elements [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") are outside its " +
                           std::to_string(t->numel()));
  uint64_t size = static_cast<uint64_t>(*DtypeSize(t->dtype));
  uint64_t chunk = manifest.chunk_bytes;
  std::vector<ReadRange> out;
  for (const PieceEntry& p : t->pieces) {
    int64_t a = std::max(first, p.first);
    int64_t b = std::min(first + count, p.first + p.count);
    if (a >= b) continue;
    // Bytes wanted within the piece, widened to whole chunks for verification.
    uint64_t lo = static_cast<uint64_t>(a - p.first) * size;
    uint64_t hi = static_cast<uint64_t>(b - p.first) * size;
    uint64_t piece_bytes = static_cast<uint64_t>(p.count) * size;
    uint64_t c0 = lo / chunk, c1 = (hi + chunk - 1) / chunk;
    ReadRange r;
    r.file = manifest.shards[p.shard].file;
    r.fetch_offset = p.offset + c0 * chunk;
    r.fetch_length = std::min(c1 * chunk, piece_bytes) - c0 * chunk;
    r.chunks.assign(p.chunks.begin() + static_cast<std::ptrdiff_t>(c0),
                    p.chunks.begin() + static_cast<std::ptrdiff_t>(c1));
    r.chunk_bytes = chunk;
    r.skip = lo - c0 * chunk;
    r.length = hi - lo;
    r.dest_first = a - first;
    out.push_back(std::move(r));
  }
  return out;
}

Status VerifyRange(const ReadRange& range, std::string_view fetched) {
  if (fetched.size() != range.fetch_length)
    return DataLoss(range.file + ": read " + std::to_string(fetched.size()) + " bytes at " +
                    std::to_string(range.fetch_offset) + ", expected " +
                    std::to_string(range.fetch_length));
  return VerifyChunks(range, 0, fetched);
}

Status VerifyChunks(const ReadRange& range, size_t first_chunk, std::string_view bytes) {
  for (size_t i = first_chunk; !bytes.empty(); ++i) {
    const uint64_t start = i * range.chunk_bytes;
    std::string_view part = bytes.substr(0, range.chunk_bytes);
    if (i >= range.chunks.size() || start + part.size() > range.fetch_length)
      return DataLoss(range.file + ": bytes past the checksummed range at " +
                      std::to_string(range.fetch_offset + start));
    if (Xxh3Hex(part) != range.chunks[i])
      return DataLoss(range.file + ": checksum mismatch in bytes [" +
                      std::to_string(range.fetch_offset + start) + ", " +
                      std::to_string(range.fetch_offset + start + part.size()) + ")");
    bytes.remove_prefix(part.size());
  }
  return OkStatus();
}

std::vector<std::string_view> BuiltShard::Parts() const {
  std::vector<std::string_view> parts = {header};
  parts.insert(parts.end(), data.begin(), data.end());
  return parts;
}

std::string BuiltShard::Bytes() const {
  std::string out;
  out.reserve(entry.size);
  for (std::string_view part : Parts()) out.append(part);
  return out;
}

std::vector<int64_t> StepsToPrune(const std::map<int64_t, CheckpointKind>& committed, int keep) {
  keep = std::max(keep, 1);
  std::vector<int64_t> fulls;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it)
    if (it->second == CheckpointKind::kFull) fulls.push_back(it->first);
  std::vector<int64_t> prune;
  for (size_t i = static_cast<size_t>(keep); i < fulls.size(); ++i) prune.push_back(fulls[i]);
  if (!fulls.empty())
    for (const auto& [step, kind] : committed)
      if (kind == CheckpointKind::kSnapshot && step < fulls.front()) prune.push_back(step);
  std::sort(prune.begin(), prune.end());
  return prune;
}

}  // namespace tidal::checkpoint
