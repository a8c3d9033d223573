// worker/data/tokenizer.h — a Hugging Face tokenizer.json tokenizer (BPE models: byte-level as
// DeepSeek-V3/R1, Qwen2 and Llama-3 ship them, and SentencePiece-style with byte fallback as
// LLaMA-2 and Mistral do). Mirrors the `tokenizers` library's pipeline: added tokens, normalizer,
// pre-tokenizer, model, post-processor; and its decoders. Depends on PCRE2 (the pre-tokenizer
// regexes), ICU (NFC/NFKC) and nlohmann/json only; no LibTorch. docs/tokenizer.md says what is
// supported and why.
//
// Invalid UTF-8: HF tokenizers takes a Python str, so Encode first replaces every invalid byte
// sequence with U+FFFD as Python's bytes.decode('utf-8', 'replace') does (WHATWG "maximal
// subpart" rule) and tokenizes that; offsets still refer to the bytes of the original input (a
// U+FFFD covers the invalid bytes it replaced).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tidal::data {

struct Encoding {
  std::vector<uint32_t> ids;
  // Byte range [first, second) of the ORIGINAL input each token came from (HF's offsets, in
  // bytes of the input string rather than chars); special tokens added by the post-processor get
  // {0,0}.
  std::vector<std::pair<uint32_t, uint32_t>> offsets;
};

namespace tokenizer_internal {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // Parses the text of a tokenizer.json. An unsupported component or model type, or a malformed
  // field, is an InvalidArgument naming it.
  static StatusOr<Tokenizer> FromJson(std::string_view tokenizer_json);
  static StatusOr<Tokenizer> FromFile(const std::string& path);

  // add_special_tokens: apply the post-processor (TemplateProcessing BOS/EOS etc.) as HF does.
  // Const and thread-safe: many threads may encode with one Tokenizer at once.
  Encoding Encode(std::string_view text, bool add_special_tokens) const;
  std::vector<uint32_t> EncodeIds(std::string_view text, bool add_special_tokens) const;
  // As HF's decode: ids unknown to the tokenizer are skipped.
  std::string Decode(std::span<const uint32_t> ids, bool skip_special_tokens) const;

  std::optional<uint32_t> TokenToId(std::string_view token) const;  // vocab or added token
  std::optional<std::string> IdToToken(uint32_t id) const;
  // max id + 1 over the model vocab and added tokens (HF len(tokenizer)).
  uint32_t vocab_size() const;
  bool IsSpecial(uint32_t id) const;  // an added token with special=true
  // A short description for logs, e.g. "BPE (byte-level), 129280 ids, 818 added tokens".
  std::string Describe() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_internal::TokenizerImpl> impl)
      : impl_(std::move(impl)) {}
  void EncodeInto(std::string_view text, bool add_special_tokens, Encoding& out,
                  bool want_offsets) const;

  std::shared_ptr<const tokenizer_internal::TokenizerImpl> impl_;
};

}  // namespace tidal::data
