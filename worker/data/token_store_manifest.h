// worker/data/token_store_manifest.h — the token store's manifest as plain data (see
// token_store.h for the layout). Apart so that the engine, which reads a store's counts and
// tokenizer facts through worker/data/row_source.h, needs no I/O library.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::data {

inline constexpr std::string_view kTokenStoreFormat = "tidal-token-store/1";
inline constexpr std::string_view kStoreManifestKey = "manifest.json";
// 256 Ki tokens: 1 MiB of ids and 32 KiB of mask bits per block.
inline constexpr uint64_t kBlockTokens = uint64_t{1} << 18;

struct StoreShard {
  std::string name;  // "shard-00000"
  uint64_t samples = 0;
  uint64_t tokens = 0;
  std::string index_xxh3;              // of the whole .index file
  std::vector<std::string> ids_xxh3;   // per block of .ids
  std::vector<std::string> mask_xxh3;  // per block of .mask
};

// What the tokenizer said about itself when the store was written; the trainer checks it
// against the model before step 0.
struct StoreTokenizer {
  std::string kind;  // "tokenizer.json" | "bytes"
  std::string description;
  std::string fingerprint;  // a hash of tokenizer.json + tokenizer_config.json, or "bytes"
  uint32_t vocab_size = 0;
  uint32_t max_id = 0;  // the largest id any sample holds
  std::optional<uint32_t> bos_id, eos_id, pad_id;
};

struct StoreManifest {
  std::string format = std::string(kTokenStoreFormat);
  std::string content_hash;   // of inputs + tokenizer + template + options (see tidal-prep)
  std::string source_format;  // text | alpaca | messages
  uint64_t samples = 0, tokens = 0, trained_tokens = 0;
  StoreTokenizer tokenizer;
  nlohmann::json report;  // what prep read, skipped and why (lines, counts)
  std::vector<StoreShard> shards;

  std::string ToJson() const;
  // Every field checked; errors name the field ("manifest.json: shards[2].ids_xxh3: ...").
  static StatusOr<StoreManifest> Parse(std::string_view json);
};

}  // namespace tidal::data
