// worker/data/tokenizer_internal.h — the pieces of the tokenizer.json pipeline behind
// tokenizer.h: UTF-8 helpers, the PCRE2 regex wrapper, normalized text with alignments,
// normalizers, pre-tokenizers, the BPE model, decoders and the post-processor. Internal to
// worker/data; only tokenizer*.cc and the tokenizer's tests include it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/utf8.h"

namespace tidal::data::tokenizer_internal {

// ---- UTF-8 ---------------------------------------------------------------------------------

inline bool IsUtf8Continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }
// Length of the (valid) UTF-8 character starting with `lead`.
inline size_t Utf8CharLength(uint8_t lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// Decodes the valid UTF-8 character at text[pos]; returns its length.
size_t DecodeUtf8(std::string_view text, size_t pos, char32_t* code_point);
using tidal::AppendUtf8;  // common/utf8.h

// Replaces each invalid sequence with U+FFFD as Python's bytes.decode('utf-8', 'replace')
// (WHATWG maximal subparts). Returns false (and leaves the outputs untouched) when `input` is
// valid. Otherwise `original_pos[i]` is the input offset of output byte i, for i in [0, size].
bool SanitizeUtf8(std::string_view input, std::string* output, std::vector<uint32_t>* original_pos);

// Rust's char::is_whitespace (Unicode White_Space) and char::is_numeric (categories Nd, Nl,
// No), and the regex crate's \w (Alphabetic, marks, Nd, Pc, Join_Control: what single_word
// added tokens check on either side), as HF uses them.
bool IsUnicodeWhitespace(char32_t code_point);
bool IsUnicodeNumeric(char32_t code_point);
bool IsRegexWordCharacter(char32_t code_point);

// GPT-2's byte-to-unicode table: byte b is shown as the character ByteLevelChar(b).
const std::array<std::string, 256>& ByteLevelChars();
// The byte a byte-level character stands for, or -1.
int ByteLevelByte(char32_t code_point);

// ---- Regex ---------------------------------------------------------------------------------

// A tokenizer.json regex (Oniguruma syntax) compiled by PCRE2 with UTF, UCP and JIT. \s and \S
// are widened to Oniguruma's Unicode White_Space (PCRE2's \s lacks U+0085).
class Regex {
 public:
  static StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping, non-empty matches of `text` (valid UTF-8) as [start, end) byte ranges.
  void FindAll(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& matches) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// A Pattern of tokenizer.json: {"String": ...} (literal) or {"Regex": ...}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;
  void FindAll(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& matches) const;
};

// ---- Normalized text -----------------------------------------------------------------------

// Original byte range [start, end) a normalized byte came from (HF's alignments).
struct Align {
  uint32_t start;
  uint32_t end;
};

// A run of normalized text: `text` points into the input or into a Scratch buffer. With
// `align` null the text is the input itself from offset `base` (no change), and a byte maps to
// the range of the input character holding it.
struct Piece {
  std::string_view text;
  const Align* align = nullptr;
  uint32_t base = 0;
  bool byte_level = false;  // the model sees each byte as its byte-level character
  int64_t token_id = -1;    // an added token matched here

  Piece Sub(size_t start, size_t end) const {
    Piece sub = *this;
    sub.text = text.substr(start, end - start);
    if (align != nullptr) {
      sub.align += start;
    } else {
      sub.base += static_cast<uint32_t>(start);
    }
    return sub;
  }
  // Original range of the normalized bytes [start, end) (end > start).
  Align Original(size_t start, size_t end) const;
};

// Owns the buffers that transformed pieces point into during one Encode.
struct Scratch {
  std::deque<std::string> texts;
  std::deque<std::vector<Align>> aligns;
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  // Makes an owned copy of `piece` with explicit alignments, to be transformed.
  void Materialize(const Piece& piece, std::string& text, std::vector<Align>& align) const;
  Piece Own(std::string text, std::vector<Align> align, const Piece& like);
};

// ---- Normalizers ---------------------------------------------------------------------------

struct Normalizer {
  enum class Type { kSequence, kNfc, kNfkc, kNfd, kNfkd, kReplace, kPrepend };
  Type type = Type::kSequence;
  std::vector<Normalizer> children;
  Pattern pattern;      // Replace
  std::string content;  // Replace's content, Prepend's prepend
};
// Normalizes `piece`; the result may point into `scratch`.
Piece Normalize(const Normalizer& normalizer, const Piece& piece, Scratch& scratch);
// HF's NormalizedString::replace and ::prepend (Metaspace and ByteLevel use them too).
Piece ReplaceInPiece(const Pattern& pattern, const std::string& content, const Piece& piece,
                     Scratch& scratch);
Piece PrependToPiece(const std::string& prefix, const Piece& piece, Scratch& scratch);

// ---- Pre-tokenizers ------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Type { kSequence, kSplit, kByteLevel, kDigits, kMetaspace };
  Type type = Type::kSequence;
  std::vector<PreTokenizer> children;
  Pattern pattern;  // Split; ByteLevel's GPT-2 regex when use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;   // ByteLevel
  bool use_regex = false;          // ByteLevel
  bool individual_digits = false;  // Digits
  std::string replacement;         // Metaspace
  enum class Prepend { kAlways, kFirst, kNever } prepend_scheme = Prepend::kAlways;
  bool split = true;  // Metaspace
};
// Splits each of `pieces` (in place) as the pre-tokenizer does.
void PreTokenize(const PreTokenizer& pre_tokenizer, std::vector<Piece>& pieces, Scratch& scratch);

// ---- BPE model -----------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using Vocab = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

// One token of a word: its id and how many bytes of the word's text it covers.
struct WordToken {
  uint32_t id;
  uint32_t length;
};

class BpeModel {
 public:
  struct Options {
    std::optional<std::string> unk_token;
    std::string continuing_subword_prefix;
    std::string end_of_word_suffix;
    bool fuse_unk = false;
    bool byte_fallback = false;
    bool ignore_merges = false;
  };
  // merges: pairs of token strings, in rank order.
  static StatusOr<std::unique_ptr<BpeModel>> Create(
      Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, Options options);
  // Appends the tokens of one pre-tokenized word.
  void Tokenize(std::string_view word, bool byte_level, std::vector<WordToken>& out) const;

  const Vocab& vocab() const { return vocab_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  bool byte_fallback() const { return options_.byte_fallback; }

 private:
  BpeModel() = default;
  void Merge(std::string_view word, bool byte_level, std::vector<WordToken>& out) const;
  struct MergeValue {
    uint32_t rank;
    uint32_t new_id;
  };
  const MergeValue* FindMerge(uint32_t left, uint32_t right) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;  // "" where an id has no token
  Options options_;
  std::optional<uint32_t> unk_id_;
  std::array<int64_t, 256> byte_level_id_{};  // id of each byte's byte-level character
  std::array<int64_t, 256> byte_fallback_id_{};
  // Open addressing over (left << 32 | right).
  std::vector<uint64_t> merge_keys_;
  std::vector<MergeValue> merge_values_;
  uint64_t merge_mask_ = 0;
  uint64_t instance_id_ = 0;  // keys the per-thread word caches
};

// ---- Decoders ------------------------------------------------------------------------------

struct Decoder {
  enum class Type { kSequence, kByteLevel, kByteFallback, kFuse, kStrip, kReplace, kMetaspace };
  Type type = Type::kSequence;
  std::vector<Decoder> children;
  Pattern pattern;            // Replace
  std::string content;        // Replace's content; Strip's and Metaspace's character
  size_t strip_start = 0;     // Strip
  size_t strip_stop = 0;      // Strip
  bool prepend_first = true;  // Metaspace: prepend_scheme != never
};
void DecodeChain(const Decoder& decoder, std::vector<std::string>& tokens);

// ---- Post-processor ------------------------------------------------------------------------

struct PostProcessor {
  enum class Type { kSequence, kTemplate, kByteLevel };
  Type type = Type::kSequence;
  std::vector<PostProcessor> children;
  // TemplateProcessing's "single": ids to insert before the sequence and after it.
  std::vector<uint32_t> prefix_ids;
  std::vector<uint32_t> suffix_ids;
  bool trim_offsets = false;     // ByteLevel
  bool add_prefix_space = true;  // ByteLevel: keeps one leading space of the first token
};

// ---- Added tokens --------------------------------------------------------------------------

struct AddedToken {
  uint32_t id;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Leftmost-longest matching of a set of added tokens (HF uses Aho-Corasick, LeftmostLongest).
class AddedTokenMatcher {
 public:
  void Build(const std::vector<AddedToken>& tokens, bool normalized);
  bool empty() const { return nodes_.size() <= 1; }
  // Splits `piece` around the added tokens it contains, honouring lstrip/rstrip/single_word.
  void Split(const Piece& piece, const std::vector<AddedToken>& tokens,
             std::vector<Piece>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> next;  // sorted by byte
    int64_t token = -1;                              // index into the tokens vector
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

// ---- The whole tokenizer -------------------------------------------------------------------

struct TokenizerImpl {
  std::vector<AddedToken> added_tokens;
  std::unordered_map<uint32_t, size_t> added_by_id;
  Vocab added_by_content;
  AddedTokenMatcher raw_matcher;         // normalized=false tokens, on the input
  AddedTokenMatcher normalized_matcher;  // normalized=true tokens, after normalization
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::optional<PostProcessor> post_processor;
  std::optional<Decoder> decoder;
  uint32_t vocab_size = 0;
  std::string description;
};

StatusOr<std::unique_ptr<TokenizerImpl>> ParseTokenizerJson(std::string_view json_text);

}  // namespace tidal::data::tokenizer_internal
