#include "worker/data/token_store.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

namespace tidal::data {
namespace {

using nlohmann::json;

std::string ShardName(size_t i) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05zu", i);
  return name;
}

bool IsHex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

template <typename T>
std::string_view Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

json OptionalId(const std::optional<uint32_t>& id) { return id ? json(*id) : json(nullptr); }

// Reads manifest fields with the path of the field in every message.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}
  template <typename T>
  Status Get(const char* key, T& out) const {
    if (!j_.is_object() || !j_.contains(key))
      return InvalidArgument("manifest.json: " + path_ + key + ": missing");
    try {
      out = j_.at(key).get<T>();
    } catch (const std::exception&) {
      return InvalidArgument("manifest.json: " + path_ + key + ": wrong type (" +
                             j_.at(key).dump() + ")");
    }
    return OkStatus();
  }
  Status Id(const char* key, std::optional<uint32_t>& out) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return OkStatus();
    uint32_t v = 0;
    TIDAL_RETURN_IF_ERROR(Get(key, v));
    out = v;
    return OkStatus();
  }

 private:
  const json& j_;
  std::string path_;
};

uint64_t Blocks(uint64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

}  // namespace

std::string Xxh3Hex(std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

std::string StoreManifest::ToJson() const {
  json shard_list = json::array();
  for (const StoreShard& s : shards)
    shard_list.push_back({{"name", s.name},
                          {"samples", s.samples},
                          {"tokens", s.tokens},
                          {"index_xxh3", s.index_xxh3},
                          {"ids_xxh3", s.ids_xxh3},
                          {"mask_xxh3", s.mask_xxh3}});
  json j = {{"format", format},
            {"content_hash", content_hash},
            {"source_format", source_format},
            {"samples", samples},
            {"tokens", tokens},
            {"trained_tokens", trained_tokens},
            {"block_tokens", kBlockTokens},
            {"tokenizer",
             {{"kind", tokenizer.kind},
              {"description", tokenizer.description},
              {"fingerprint", tokenizer.fingerprint},
              {"vocab_size", tokenizer.vocab_size},
              {"max_id", tokenizer.max_id},
              {"bos_id", OptionalId(tokenizer.bos_id)},
              {"eos_id", OptionalId(tokenizer.eos_id)},
              {"pad_id", OptionalId(tokenizer.pad_id)}}},
            {"report", report.is_null() ? json::object() : report},
            {"shards", shard_list}};
  return j.dump(2) + "\n";
}

StatusOr<StoreManifest> StoreManifest::Parse(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("manifest.json: not a JSON object");
  StoreManifest m;
  Reader r(j, "");
  TIDAL_RETURN_IF_ERROR(r.Get("format", m.format));
  if (m.format != kTokenStoreFormat)
    return InvalidArgument("manifest.json: format: expected \"" + std::string(kTokenStoreFormat) +
                           "\", got \"" + m.format + "\"");
  uint64_t block_tokens = 0;
  TIDAL_RETURN_IF_ERROR(r.Get("block_tokens", block_tokens));
  if (block_tokens != kBlockTokens)
    return InvalidArgument("manifest.json: block_tokens: expected " + std::to_string(kBlockTokens) +
                           ", got " + std::to_string(block_tokens));
  TIDAL_RETURN_IF_ERROR(r.Get("content_hash", m.content_hash));
  TIDAL_RETURN_IF_ERROR(r.Get("source_format", m.source_format));
  TIDAL_RETURN_IF_ERROR(r.Get("samples", m.samples));
  TIDAL_RETURN_IF_ERROR(r.Get("tokens", m.tokens));
  TIDAL_RETURN_IF_ERROR(r.Get("trained_tokens", m.trained_tokens));
  if (!j.contains("tokenizer") || !j["tokenizer"].is_object())
    return InvalidArgument("manifest.json: tokenizer: missing");
  Reader t(j["tokenizer"], "tokenizer.");
  TIDAL_RETURN_IF_ERROR(t.Get("kind", m.tokenizer.kind));
  TIDAL_RETURN_IF_ERROR(t.Get("description", m.tokenizer.description));
  TIDAL_RETURN_IF_ERROR(t.Get("fingerprint", m.tokenizer.fingerprint));
  TIDAL_RETURN_IF_ERROR(t.Get("vocab_size", m.tokenizer.vocab_size));
  TIDAL_RETURN_IF_ERROR(t.Get("max_id", m.tokenizer.max_id));
  TIDAL_RETURN_IF_ERROR(t.Id("bos_id", m.tokenizer.bos_id));
  TIDAL_RETURN_IF_ERROR(t.Id("eos_id", m.tokenizer.eos_id));
  TIDAL_RETURN_IF_ERROR(t.Id("pad_id", m.tokenizer.pad_id));
  if (j.contains("report")) m.report = j["report"];
  if (!j.contains("shards") || !j["shards"].is_array())
    return InvalidArgument("manifest.json: shards: missing or not a list");
  uint64_t samples = 0, tokens = 0;
  for (size_t i = 0; i < j["shards"].size(); ++i) {
    const std::string path = "shards[" + std::to_string(i) + "].";
    Reader s(j["shards"][i], path);
    StoreShard shard;
    TIDAL_RETURN_IF_ERROR(s.Get("name", shard.name));
    if (shard.name != ShardName(i))
      return InvalidArgument("manifest.json: " + path + "name: expected " + ShardName(i) +
                             ", got \"" + shard.name + "\"");
    TIDAL_RETURN_IF_ERROR(s.Get("samples", shard.samples));
    TIDAL_RETURN_IF_ERROR(s.Get("tokens", shard.tokens));
    TIDAL_RETURN_IF_ERROR(s.Get("index_xxh3", shard.index_xxh3));
    TIDAL_RETURN_IF_ERROR(s.Get("ids_xxh3", shard.ids_xxh3));
    TIDAL_RETURN_IF_ERROR(s.Get("mask_xxh3", shard.mask_xxh3));
    const uint64_t blocks = Blocks(shard.tokens);
    if (shard.ids_xxh3.size() != blocks || shard.mask_xxh3.size() != blocks)
      return InvalidArgument("manifest.json: " + path + "ids_xxh3/mask_xxh3: expected " +
                             std::to_string(blocks) + " block checksums for " +
                             std::to_string(shard.tokens) + " tokens");
    bool hex = IsHex16(shard.index_xxh3);
    for (const auto& h : shard.ids_xxh3) hex = hex && IsHex16(h);
    for (const auto& h : shard.mask_xxh3) hex = hex && IsHex16(h);
    if (!hex)
      return InvalidArgument("manifest.json: " + path + "checksums: expected 16 hex digits each");
    samples += shard.samples;
    tokens += shard.tokens;
    m.shards.push_back(std::move(shard));
  }
  if (samples != m.samples || tokens != m.tokens)
    return InvalidArgument("manifest.json: samples/tokens (" + std::to_string(m.samples) + "/" +
                           std::to_string(m.tokens) + ") disagree with the shards' sums (" +
                           std::to_string(samples) + "/" + std::to_string(tokens) + ")");
  return m;
}

TokenStoreWriter::TokenStoreWriter(objstore::ObjectStore& store, uint64_t shard_tokens)
    : store_(store), shard_tokens_(std::max<uint64_t>(shard_tokens, 1)) {}

Status TokenStoreWriter::Add(std::span<const uint32_t> ids, std::span<const uint8_t> mask) {
  if (ids.empty()) return InvalidArgument("token store: an empty sample cannot be stored");
  if (ids.size() != mask.size())
    return InvalidArgument("token store: " + std::to_string(ids.size()) + " ids but " +
                           std::to_string(mask.size()) + " mask entries");
  const uint64_t base = ids_.size();
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  mask_bits_.resize((ids_.size() + 7) / 8, 0);
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) continue;
    const uint64_t at = base + i;
    mask_bits_[at / 8] |= static_cast<uint8_t>(1u << (at % 8));
    ++trained_;
  }
  for (uint32_t id : ids) max_id_ = std::max(max_id_, id);
  offsets_.push_back(ids_.size());
  ++samples_;
  tokens_ += ids.size();
  if (ids_.size() >= shard_tokens_) return FlushShard();
  return OkStatus();
}

Status TokenStoreWriter::FlushShard() {
  if (offsets_.size() == 1) return OkStatus();
  StoreShard shard;
  shard.name = ShardName(shards_.size());
  shard.samples = offsets_.size() - 1;
  shard.tokens = ids_.size();
  for (uint64_t b = 0; b < Blocks(shard.tokens); ++b) {
    const uint64_t first = b * kBlockTokens;
    const uint64_t count = std::min(kBlockTokens, shard.tokens - first);
    shard.ids_xxh3.push_back(Xxh3Hex(Bytes(ids_).substr(first * 4, count * 4)));
    shard.mask_xxh3.push_back(Xxh3Hex(Bytes(mask_bits_).substr(first / 8, (count + 7) / 8)));
  }
  shard.index_xxh3 = Xxh3Hex(Bytes(offsets_));
  TIDAL_RETURN_IF_ERROR(store_.Put(shard.name + ".ids", Bytes(ids_)));
  TIDAL_RETURN_IF_ERROR(store_.Put(shard.name + ".mask", Bytes(mask_bits_)));
  TIDAL_RETURN_IF_ERROR(store_.Put(shard.name + ".index", Bytes(offsets_)));
  shards_.push_back(std::move(shard));
  ids_.clear();
  mask_bits_.clear();
  offsets_.assign(1, 0);
  return OkStatus();
}

Status TokenStoreWriter::Finish(StoreManifest manifest) {
  TIDAL_RETURN_IF_ERROR(FlushShard());
  if (samples_ == 0) return InvalidArgument("token store: no samples to store");
  manifest.samples = samples_;
  manifest.tokens = tokens_;
  manifest.trained_tokens = trained_;
  manifest.tokenizer.max_id = max_id_;
  manifest.shards = shards_;
  return store_.Put(std::string(kStoreManifestKey), manifest.ToJson());
}

StatusOr<std::optional<StoreManifest>> ReadStoreManifest(objstore::ObjectStore& store) {
  auto text = store.Get(std::string(kStoreManifestKey));
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<StoreManifest>();
    return text.status();
  }
  auto parsed = StoreManifest::Parse(*text);
  if (!parsed.ok())
    return Status(parsed.status().code(), store.uri() + "/" + parsed.status().message());
  return std::optional<StoreManifest>(std::move(*parsed));
}

StatusOr<StoreIndex> StoreIndex::Open(objstore::ObjectStore& store) {
  TIDAL_ASSIGN_OR_RETURN(auto manifest, ReadStoreManifest(store));
  if (!manifest)
    return NotFound(store.uri() +
                    " holds no token store (no manifest.json; tidal-prep writes one)");
  StoreIndex index;
  index.manifest_ = std::move(*manifest);
  index.locations_.reserve(index.manifest_.samples);
  for (size_t s = 0; s < index.manifest_.shards.size(); ++s) {
    const StoreShard& shard = index.manifest_.shards[s];
    const std::string key = shard.name + ".index";
    std::string bytes;
    for (int attempt = 0;; ++attempt) {  // a torn read is fetched once more, then refused
      TIDAL_ASSIGN_OR_RETURN(bytes, store.Get(key));
      if (Xxh3Hex(bytes) == shard.index_xxh3) break;
      if (attempt == 1)
        return DataLoss(store.uri() + "/" + key + ": checksum mismatch (read twice); the store " +
                        "is damaged: run tidal-prep again");
    }
    if (bytes.size() != (shard.samples + 1) * 8)
      return DataLoss(store.uri() + "/" + key + ": " + std::to_string(bytes.size()) +
                      " bytes, expected " + std::to_string((shard.samples + 1) * 8));
    std::vector<uint64_t> offsets(shard.samples + 1);
    std::memcpy(offsets.data(), bytes.data(), bytes.size());
    if (offsets.front() != 0 || offsets.back() != shard.tokens)
      return DataLoss(store.uri() + "/" + key + ": offsets do not span the shard's tokens");
    for (uint64_t i = 0; i < shard.samples; ++i) {
      if (offsets[i + 1] <= offsets[i])
        return DataLoss(store.uri() + "/" + key + ": sample " + std::to_string(i) + " is empty");
      index.locations_.push_back({static_cast<uint32_t>(s), offsets[i], offsets[i + 1]});
    }
  }
  return index;
}

std::vector<uint32_t> StoreIndex::Lengths() const {
  std::vector<uint32_t> lengths;
  lengths.reserve(locations_.size());
  for (const SampleLocation& l : locations_)
    lengths.push_back(static_cast<uint32_t>(std::min<uint64_t>(l.length(), UINT32_MAX)));
  return lengths;
}

}  // namespace tidal::data
