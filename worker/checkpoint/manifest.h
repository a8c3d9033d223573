// worker/checkpoint/manifest.h — the checkpoint format of DESIGN.md §5, without LibTorch:
//
//   <root>/step-00000015/shard-00001-of-00003.safetensors   one per saving rank
//   <root>/step-00000015/trainer_state.json
//   <root>/step-00000015/manifest.json                      written last: its presence commits
//   <root>/latest                                           "step-00000015", after the manifest
//
// A logical tensor ("model.layers.3.self_attn.q_proj.lora_A.weight",
// "optimizer.exp_avg.<same>") is cut into pieces: contiguous element ranges of its row-major
// flattening, each stored as a 1-D tensor in one shard. The manifest names every tensor's
// dtype and global shape, and for every piece the shard, the absolute byte offset in the shard
// file, the element range and XXH3-64 checksums of its bytes in 64 KiB chunks — so a rank that
// reads only the ranges it needs (HTTP range GETs) still verifies what it read. Each shard also has
// its size and whole-file checksum. Pure functions: building shards, (de)serialising and
// validating manifests, planning ranged reads, naming and retention.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::checkpoint {

inline constexpr int kFormatVersion = 1;
// 64 KiB: a rank loading a slice of a piece reads at most 64 KiB it does not need at each
// end (LoRA pieces are often under 1 MiB), for a manifest entry of 19 bytes per chunk.
inline constexpr uint64_t kDefaultChunkBytes = 64 << 10;

struct PieceEntry {
  int shard = 0;        // index into Manifest::shards
  uint64_t offset = 0;  // absolute byte offset of the piece's data in the shard file
  int64_t first = 0;    // element range [first, first + count) of the flattened tensor
  int64_t count = 0;
  // XXH3-64 (16 lowercase hex digits) of each Manifest::chunk_bytes chunk of the piece's
  // bytes, from its start (the last chunk may be shorter): a ranged read verifies the chunks
  // it covers, so reading 1/W' of a piece saved at W costs at most one chunk extra per end.
  std::vector<std::string> chunks;
};

struct TensorEntry {
  std::string name;
  std::string dtype;  // safetensors names: F32, BF16, F16, ...
  std::vector<int64_t> shape;
  std::vector<PieceEntry> pieces;  // sorted by `first`, covering [0, numel) exactly once
  int64_t numel() const;
};

struct ShardEntry {
  std::string file;  // "shard-00001-of-00003.safetensors"
  uint64_t size = 0;
  std::string xxh3;
};

enum class CheckpointKind { kFull, kSnapshot };
const char* KindName(CheckpointKind kind);

struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  int world_size = 1;
  int zero_stage = 0;
  std::string config_hash;  // of what must match to resume (model, LoRA, batch)
  std::string created_at;   // RFC 3339
  // The generation that committed it (the fencing token, Repository::Fence); 0: a run outside
  // the operator (tidal-train, tools), which is not fenced.
  int64_t generation = 0;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  std::vector<ShardEntry> shards;
  std::vector<TensorEntry> tensors;  // sorted by name

  const TensorEntry* Find(const std::string& name) const;
};

nlohmann::json ToJson(const Manifest& manifest);
// Validates everything a reader relies on: version, names, dtypes, shapes, pieces covering
// each tensor exactly once within their shard's size. Errors name the field.
StatusOr<Manifest> ManifestFromJson(const nlohmann::json& json);

// Bytes per element of a safetensors dtype name; nullopt for an unknown one.
std::optional<int> DtypeSize(const std::string& dtype);
std::string Xxh3Hex(std::string_view bytes);

// One piece a rank contributes to its shard.
struct PieceData {
  std::string tensor;
  std::string dtype;
  std::vector<int64_t> shape;  // the tensor's global shape
  int64_t first = 0;
  std::string_view bytes;  // count = bytes.size() / dtype size
};

// A shard file in safetensors layout (pieces as 1-D tensors named "<tensor>@<first>") and
// the manifest entries for its pieces (with `shard` set to `shard_index`), checksummed in
// chunks of `chunk_bytes`. The file is `header` followed by `data`: views of the pieces' bytes,
// not copies (a copy of a checkpoint into fresh memory costs more than writing it), so the
// pieces must outlive the write.
struct BuiltShard {
  std::string header;                  // 8-byte length + JSON header
  std::vector<std::string_view> data;  // the pieces, in file order
  ShardEntry entry;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  std::vector<std::pair<TensorEntry, PieceEntry>> pieces;  // tensor (no pieces) + its piece

  std::vector<std::string_view> Parts() const;  // header, then data: the file in order
  std::string Bytes() const;                    // the whole file, copied
};
StatusOr<BuiltShard> BuildShard(int shard_index, int shard_count,
                                const std::vector<PieceData>& pieces,
                                uint64_t chunk_bytes = kDefaultChunkBytes);

// Combines the shards of every rank into the manifest's tensors (sorted, validated).
StatusOr<Manifest> AssembleManifest(Manifest header, const std::vector<BuiltShard>& shards);

// One ranged read for part of a tensor: fetch `fetch_length` bytes at `fetch_offset` of `file`
// (widened to whole checksum chunks), verify them against `chunks`, then the wanted `length`
// bytes start `skip` bytes in and land at element `dest_first` of the requested range.
struct ReadRange {
  std::string file;
  uint64_t fetch_offset = 0;
  uint64_t fetch_length = 0;
  std::vector<std::string> chunks;  // expected XXH3 of consecutive chunks of the fetched bytes
  uint64_t chunk_bytes = 0;
  uint64_t skip = 0;
  uint64_t length = 0;
  int64_t dest_first = 0;
};
// The ranges holding elements [first, first + count) of `tensor`.
StatusOr<std::vector<ReadRange>> PlanRead(const Manifest& manifest, const std::string& tensor,
                                          int64_t first, int64_t count);
// DataLoss naming the file and byte range when a fetched chunk does not match its checksum.
Status VerifyRange(const ReadRange& range, std::string_view fetched);
// The same for `bytes`: whole consecutive chunks of the range starting at chunk `first_chunk`
// (the last may be the range's short final chunk).
Status VerifyChunks(const ReadRange& range, size_t first_chunk, std::string_view bytes);

std::string StepDirectory(int64_t step);  // "step-00000015"
std::optional<int64_t> ParseStepDirectory(std::string_view name);
std::string ShardFileName(int index, int count);  // 0-based index → "shard-00001-of-00003..."

// What to delete given the committed checkpoints (step → kind) and `keep` full ones: the
// full checkpoints beyond the newest `keep`, and snapshots older than the newest full.
std::vector<int64_t> StepsToPrune(const std::map<int64_t, CheckpointKind>& committed, int keep);

}  // namespace tidal::checkpoint
