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
// file, the element range and an xxh3-64 checksum of the piece's bytes — so a rank that reads
// only the ranges it needs (HTTP range GETs) still verifies what it read. Each shard also has
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

struct PieceEntry {
  int shard = 0;        // index into Manifest::shards
  uint64_t offset = 0;  // absolute byte offset of the piece's data in the shard file
  int64_t first = 0;    // element range [first, first + count) of the flattened tensor
  int64_t count = 0;
  std::string xxh3;  // 16 lowercase hex digits of XXH3-64 over the piece's bytes
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
// the manifest entries for its pieces (with `shard` set to `shard_index`).
struct BuiltShard {
  std::string bytes;
  ShardEntry entry;
  std::vector<std::pair<TensorEntry, PieceEntry>> pieces;  // tensor (no pieces) + its piece
};
StatusOr<BuiltShard> BuildShard(int shard_index, int shard_count,
                                const std::vector<PieceData>& pieces);

// Combines the shards of every rank into the manifest's tensors (sorted, validated).
StatusOr<Manifest> AssembleManifest(Manifest header, const std::vector<BuiltShard>& shards);

// A byte range to fetch for part of a tensor: `length` bytes at `offset` of `file`, landing at
// element `dest_first` of the requested range.
struct ReadRange {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t dest_first = 0;
  const PieceEntry* piece = nullptr;  // whose checksum covers the range when whole
  bool whole_piece = false;
};
// The ranges holding elements [first, first + count) of `tensor`.
StatusOr<std::vector<ReadRange>> PlanRead(const Manifest& manifest, const std::string& tensor,
                                          int64_t first, int64_t count);

std::string StepDirectory(int64_t step);  // "step-00000015"
std::optional<int64_t> ParseStepDirectory(std::string_view name);
std::string ShardFileName(int index, int count);  // 0-based index → "shard-00001-of-00003..."

// What to delete given the committed checkpoints (step → kind) and `keep` full ones: the
// full checkpoints beyond the newest `keep`, and snapshots older than the newest full.
std::vector<int64_t> StepsToPrune(const std::map<int64_t, CheckpointKind>& committed, int keep);

}  // namespace tidal::checkpoint
