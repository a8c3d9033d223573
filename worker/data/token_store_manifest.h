// worker/data/token_store_manifest.h — the token store's manifest as plain data (see
// token_store.h for the layout). Its tokenizer section is what the engine checks against the
// model (engine::TokenizerFacts, worker/engine/row_source.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/engine/row_source.h"

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

struct StoreManifest {
  std::string format = std::string(kTokenStoreFormat);
  std::string content_hash;   // of inputs + tokenizer + template + options (see tidal-prep)
  std::string source_format;  // text | alpaca | messages
  uint64_t samples = 0, tokens = 0, trained_tokens = 0;
  engine::TokenizerFacts tokenizer;
  nlohmann::json report;  // what prep read, skipped and why (lines, counts)
  std::vector<StoreShard> shards;

  std::string ToJson() const;
  // Every field checked; errors name the field ("manifest.json: shards[2].ids_xxh3: ...").
  static StatusOr<StoreManifest> Parse(std::string_view json);
};

}  // namespace tidal::data
