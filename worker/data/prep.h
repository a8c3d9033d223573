// worker/data/prep.h — tidal-prep: a JSONL dataset (text, alpaca or messages records) on
// file:// or s3://, tokenized once with the model's own tokenizer.json and chat template, in
// parallel over the cores, into a token store (token_store.h) on file:// or s3://.
//
// The store goes to <output>/<content hash>/, the hash covering the input's bytes, the
// tokenizer files, the format and the options: running again on the same input finds the
// manifest and does nothing; a changed input, tokenizer or template gets a store of its own.
//
// What trains: `text` — every token; `alpaca` and `messages` — the assistant's tokens only
// (the chat template's rendering, with per-turn spans, chat_template.h); system, user and
// tool tokens are -100 in the loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/data/token_store.h"
#include "worker/objstore/object_store.h"

namespace tidal::data {

class ChatTemplate;
class Tokenizer;

// The model's tokenizer.json and tokenizer_config.json (chat template, special tokens), or the
// byte tokenizer (ids 0–255 are bytes, 256 begins and 257 ends a document) of models trained on
// raw bytes — Tidal's random-initialised presets.
class TextEncoder {
 public:
  // From an HF model directory (file:// or s3://): tokenizer.json is required,
  // tokenizer_config.json optional (no chat template then). Errors name the file.
  // `previous`, an encoder made before (or null), lends its tokenizer when tokenizer.json is
  // the text it was parsed from: parsing is nearly all of the cost (0.5 s for DeepSeek-V3's).
  static StatusOr<std::unique_ptr<TextEncoder>> FromModelDirectory(
      const std::string& uri, const objstore::S3Options& s3, const TextEncoder* previous = nullptr);
  static StatusOr<std::unique_ptr<TextEncoder>> FromFiles(std::string tokenizer_json,
                                                          std::string tokenizer_config_json,
                                                          const TextEncoder* previous = nullptr);
  static std::unique_ptr<TextEncoder> Bytes();
  ~TextEncoder();

  bool is_bytes() const { return tokenizer_ == nullptr; }
  bool has_chat_template() const { return chat_ != nullptr; }
  // A hash of what decides the ids: the files' bytes (or "bytes").
  const std::string& fingerprint() const { return fingerprint_; }
  engine::TokenizerFacts Facts() const;

  struct Tokens {
    std::vector<uint32_t> ids;
    std::vector<uint8_t> trains;  // per token
  };
  // One record of `format` ("text" | "alpaca" | "messages") → tokens and what trains. Errors
  // (InvalidArgument) say what the record lacks, e.g. `"messages"[2].content: expected a string`.
  StatusOr<Tokens> EncodeRecord(const nlohmann::json& record, const std::string& format) const;
  std::string Decode(std::span<const uint32_t> ids) const;

 private:
  TextEncoder();
  StatusOr<Tokens> EncodeText(const std::string& text) const;
  StatusOr<Tokens> EncodeChat(const nlohmann::json& messages, const nlohmann::json& tools) const;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string tokenizer_digest_;  // XXH3-128 of tokenizer.json: what `previous` is matched on
  std::unique_ptr<ChatTemplate> chat_;
  std::optional<uint32_t> bos_, eos_, pad_;
  bool add_bos_ = false;  // tokenizer_config.json add_bos_token: text documents begin with BOS
  std::string fingerprint_;
};

struct PrepOptions {
  std::string input_uri;  // one JSONL object: /path, file:///path, s3://bucket/key
  std::string format = "messages";
  std::string output_uri;  // the store goes to <output_uri>/<content hash>
  // Only look for the store (NotFound when it is not there): what ranks other than 0 do.
  bool lookup_only = false;
  bool strict = false;  // a malformed or unusable record is fatal instead of skipped
  int threads = 0;      // 0: every core
  uint64_t shard_tokens = uint64_t{16} << 20;
  // Called now and then with (input bytes done, total, samples, tokens); tidal-prep draws a
  // progress line from it.
  std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> progress;
};

struct PrepResult {
  std::string store_uri;
  bool reused = false;  // a store with the same content hash was there: nothing was done
  StoreManifest manifest;
};

StatusOr<PrepResult> Prepare(const PrepOptions& options, const TextEncoder& encoder,
                             const objstore::S3Options& s3);

// "s3://b/dir/file.jsonl" → ("s3://b/dir", "file.jsonl"); "/a/b.jsonl" → ("file:///a", "b.jsonl").
StatusOr<std::pair<std::string, std::string>> SplitObjectUri(const std::string& uri);

// Whether `uri` names a token store (a prefix holding manifest.json) rather than a JSONL object.
StatusOr<bool> IsTokenStore(const std::string& uri, const objstore::S3Options& s3);

// The first `count` samples of the store as JSON objects: ids, the loss mask, and the decoded
// text with its spans marked ({"train": bool, "text": ...}), for `tidal-prep --inspect`.
StatusOr<std::vector<nlohmann::json>> InspectStore(const std::string& store_uri, uint64_t count,
                                                   const TextEncoder& encoder,
                                                   const objstore::S3Options& s3);

}  // namespace tidal::data
