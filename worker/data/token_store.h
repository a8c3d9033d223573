// worker/data/token_store.h — the sharded token store `tidal-prep` writes and the loader reads
// (DESIGN.md §6). A store is a prefix of an object store (file:// or s3://):
//
//   <uri>/manifest.json          written LAST: its presence is the commit (as checkpoints, §5)
//   <uri>/shard-00000.ids        uint32 little-endian token ids, the shard's samples back to back
//   <uri>/shard-00000.mask       one bit per token (LSB first): 1 = the token is a training target
//   <uri>/shard-00000.index      uint64 little-endian: samples + 1 token offsets into .ids
//
// Ids and mask bits are cut into blocks of kBlockTokens tokens; the manifest carries an XXH3
// checksum per block of each file and per index file, so a rank that reads a few rows by range
// verifies exactly what it read, and a node-local cache verifies what it serves. Nothing here
// includes LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/data/token_store_manifest.h"
#include "worker/objstore/object_store.h"

namespace tidal::data {

std::string Xxh3Hex(std::string_view bytes);

// Accumulates samples in order and writes full shards as they fill; Finish writes the last
// shard and then the manifest. Not thread-safe: tidal-prep tokenizes in parallel and adds in
// input order, so a store is a pure function of its inputs.
class TokenStoreWriter {
 public:
  TokenStoreWriter(objstore::ObjectStore& store, uint64_t shard_tokens);
  // ids and mask (same length, mask[i] != 0 → token i trains). An empty sample is refused.
  Status Add(std::span<const uint32_t> ids, std::span<const uint8_t> mask);
  // Completes the manifest (counts, shards) and writes it last.
  Status Finish(StoreManifest manifest);
  uint64_t samples() const { return samples_; }
  uint64_t tokens() const { return tokens_; }

 private:
  Status FlushShard();
  objstore::ObjectStore& store_;
  uint64_t shard_tokens_;
  std::vector<StoreShard> shards_;
  std::vector<uint32_t> ids_;
  std::vector<uint8_t> mask_bits_;
  std::vector<uint64_t> offsets_{0};
  uint64_t samples_ = 0, tokens_ = 0, trained_ = 0;
  uint32_t max_id_ = 0;
};

// A sample's place: which shard, and its token range in that shard.
struct SampleLocation {
  uint32_t shard = 0;
  uint64_t begin = 0, end = 0;
  uint64_t length() const { return end - begin; }
};

// The manifest and every index, read and verified once; maps a global sample index (order of
// the store) to its location. Pure data once opened.
class StoreIndex {
 public:
  static StatusOr<StoreIndex> Open(objstore::ObjectStore& store);
  const StoreManifest& manifest() const { return manifest_; }
  uint64_t num_samples() const { return locations_.size(); }
  const SampleLocation& at(uint64_t sample) const { return locations_[sample]; }
  std::vector<uint32_t> Lengths() const;  // tokens per sample, clamped to 2^32-1

 private:
  StoreManifest manifest_;
  std::vector<SampleLocation> locations_;
};

// Reads `manifest.json` if the store holds one; nullopt when the prefix holds no store.
StatusOr<std::optional<StoreManifest>> ReadStoreManifest(objstore::ObjectStore& store);

}  // namespace tidal::data
