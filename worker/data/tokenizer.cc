// worker/data/tokenizer.cc — Encode and Decode over the parsed pipeline, as the `tokenizers`
// crate's Tokenizer::encode / decode: added tokens are split off first, the rest is normalized,
// pre-tokenized and handed to the BPE model word by word; offsets follow each byte back to the
// input.
#include "worker/data/tokenizer.h"

#include <fstream>
#include <sstream>

#include "worker/data/tokenizer_internal.h"

namespace tidal::data {

using tokenizer_internal::Align;
using tokenizer_internal::Decoder;
using tokenizer_internal::Piece;
using tokenizer_internal::PostProcessor;
using tokenizer_internal::Scratch;
using tokenizer_internal::TokenizerImpl;
using tokenizer_internal::WordToken;

StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json) {
  TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<TokenizerImpl> impl,
                         tokenizer_internal::ParseTokenizerJson(tokenizer_json));
  return Tokenizer(std::shared_ptr<const TokenizerImpl>(std::move(impl)));
}

StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return NotFound("cannot open tokenizer file " + path);
  std::ostringstream text;
  text << file.rdbuf();
  auto tokenizer = FromJson(text.str());
  if (!tokenizer.ok()) return tokenizer.status().WithContext(path);
  return tokenizer;
}

namespace {

// HF's ByteLevel post-processor with trim_offsets (process_offsets): offsets leave out the
// token's leading and trailing spaces, but the first token keeps the one space that
// add_prefix_space put there. HF counts the spaces in bytes and its Python binding then takes
// the character holding each trimmed position: here the positions go back to the start of
// their character in `input`.
void TrimOffsets(const TokenizerImpl& impl, bool add_prefix_space, std::string_view input,
                 Encoding& out) {
  auto char_start = [&](uint32_t pos) {
    while (pos > 0 && pos < input.size() &&
           tokenizer_internal::IsUtf8Continuation(static_cast<uint8_t>(input[pos]))) {
      --pos;
    }
    return pos;
  };
  const std::string space = tokenizer_internal::ByteLevelChars()[' '];
  for (size_t i = 0; i < out.ids.size(); ++i) {
    auto token = std::optional<std::string>();
    const auto [start, end] = out.offsets[i];
    if (impl.added_by_id.contains(out.ids[i])) {
      // An added token's string is the text it matched, with what lstrip/rstrip took.
      if (end > start && end <= input.size()) token = std::string(input.substr(start, end - start));
    } else if (out.ids[i] < impl.model->id_to_token().size()) {
      token = impl.model->id_to_token()[out.ids[i]];
    }
    if (!token) continue;
    auto is_space = [&](std::string_view text, size_t pos, size_t* length) {
      char32_t c;
      *length = tokenizer_internal::DecodeUtf8(text, pos, &c);
      return text.substr(pos, *length) == space || tokenizer_internal::IsUnicodeWhitespace(c);
    };
    size_t leading = 0, trailing = 0, length = 0;
    for (size_t pos = 0; pos < token->size() && is_space(*token, pos, &length); pos += length) {
      ++leading;
    }
    for (size_t end = token->size(); end > 0;) {
      size_t start = end - 1;
      while (start > 0 &&
             tokenizer_internal::IsUtf8Continuation(static_cast<uint8_t>((*token)[start]))) {
        --start;
      }
      if (!is_space(*token, start, &length)) break;
      ++trailing;
      end = start;
    }
    auto& [first, second] = out.offsets[i];
    const bool is_first = i == 0 || first == 0;
    if (is_first && add_prefix_space && leading == 1) leading = 0;
    if (leading > 0) first = std::min<uint32_t>(first + static_cast<uint32_t>(leading), second);
    if (trailing > 0 && second >= trailing) {
      second = std::max<uint32_t>(second - static_cast<uint32_t>(trailing), first);
    }
    if (leading > 0 || trailing > 0) {
      first = char_start(first);
      second = char_start(second);
    }
  }
}

void PostProcess(const TokenizerImpl& impl, const PostProcessor& post, bool add_special_tokens,
                 bool want_offsets, std::string_view input, Encoding& out) {
  switch (post.type) {
    case PostProcessor::Type::kSequence:
      for (const PostProcessor& child : post.children) {
        PostProcess(impl, child, add_special_tokens, want_offsets, input, out);
      }
      return;
    case PostProcessor::Type::kByteLevel:
      if (post.trim_offsets && want_offsets) TrimOffsets(impl, post.add_prefix_space, input, out);
      return;
    case PostProcessor::Type::kTemplate:
      if (!add_special_tokens) return;
      out.ids.insert(out.ids.begin(), post.prefix_ids.begin(), post.prefix_ids.end());
      out.ids.insert(out.ids.end(), post.suffix_ids.begin(), post.suffix_ids.end());
      if (want_offsets) {
        out.offsets.insert(out.offsets.begin(), post.prefix_ids.size(), {0, 0});
        out.offsets.insert(out.offsets.end(), post.suffix_ids.size(), {0, 0});
      }
      return;
  }
}

// Per-thread buffers of one Encode (no allocation per call once warm).
struct EncodeBuffers {
  Scratch scratch;
  std::vector<Piece> added_split;
  std::vector<Piece> pieces;
  std::vector<WordToken> words;
  std::string sanitized;
  std::vector<uint32_t> original_pos;
  void Clear() {
    scratch.texts.clear();
    scratch.aligns.clear();
    added_split.clear();
    pieces.clear();
  }
};

}  // namespace

void Tokenizer::EncodeInto(std::string_view text, bool add_special_tokens, Encoding& out,
                           bool want_offsets) const {
  const TokenizerImpl& impl = *impl_;
  thread_local EncodeBuffers buffers;
  buffers.Clear();
  const bool sanitized =
      tokenizer_internal::SanitizeUtf8(text, &buffers.sanitized, &buffers.original_pos);
  const std::string_view input = sanitized ? std::string_view(buffers.sanitized) : text;

  Piece whole;
  whole.text = input;
  if (impl.raw_matcher.empty()) {
    buffers.added_split.push_back(whole);
  } else {
    impl.raw_matcher.Split(whole, impl.added_tokens, buffers.added_split);
  }
  for (const Piece& piece : buffers.added_split) {
    if (piece.token_id >= 0) {
      buffers.pieces.push_back(piece);
      continue;
    }
    const Piece normalized =
        impl.normalizer ? tokenizer_internal::Normalize(*impl.normalizer, piece, buffers.scratch)
                        : piece;
    if (impl.normalized_matcher.empty()) {
      buffers.pieces.push_back(normalized);
    } else {
      impl.normalized_matcher.Split(normalized, impl.added_tokens, buffers.pieces);
    }
  }
  if (impl.pre_tokenizer) {
    tokenizer_internal::PreTokenize(*impl.pre_tokenizer, buffers.pieces, buffers.scratch);
  }

  auto original = [&](Align a) {
    if (sanitized) a = {buffers.original_pos[a.start], buffers.original_pos[a.end]};
    return std::pair<uint32_t, uint32_t>(a.start, a.end);
  };
  for (const Piece& piece : buffers.pieces) {
    if (piece.token_id >= 0) {
      out.ids.push_back(static_cast<uint32_t>(piece.token_id));
      if (want_offsets) {
        out.offsets.push_back(piece.text.empty() ? original({piece.base, piece.base})
                                                 : original(piece.Original(0, piece.text.size())));
      }
      continue;
    }
    buffers.words.clear();
    impl.model->Tokenize(piece.text, piece.byte_level, buffers.words);
    size_t pos = 0;
    for (const WordToken& token : buffers.words) {
      out.ids.push_back(token.id);
      if (want_offsets) out.offsets.push_back(original(piece.Original(pos, pos + token.length)));
      pos += token.length;
    }
  }
  if (impl.post_processor) {
    PostProcess(impl, *impl.post_processor, add_special_tokens, want_offsets, text, out);
  }
}

Encoding Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  Encoding encoding;
  EncodeInto(text, add_special_tokens, encoding, /*want_offsets=*/true);
  return encoding;
}

std::vector<uint32_t> Tokenizer::EncodeIds(std::string_view text, bool add_special_tokens) const {
  Encoding encoding;
  EncodeInto(text, add_special_tokens, encoding, /*want_offsets=*/false);
  return std::move(encoding.ids);
}

// ---- Decoding ------------------------------------------------------------------------------

namespace tokenizer_internal {
namespace {

std::string LossyUtf8(std::string bytes) {
  std::string sanitized;
  std::vector<uint32_t> positions;
  return SanitizeUtf8(bytes, &sanitized, &positions) ? sanitized : bytes;
}

void DecodeByteLevel(std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    const size_t mark = bytes.size();
    bool all_mapped = true;
    for (size_t i = 0; i < token.size();) {
      char32_t c;
      i += DecodeUtf8(token, i, &c);
      const int byte = ByteLevelByte(c);
      if (byte < 0) {
        all_mapped = false;
        break;
      }
      bytes.push_back(static_cast<char>(byte));
    }
    if (!all_mapped) {
      bytes.resize(mark);
      bytes += token;
    }
  }
  tokens.assign(1, LossyUtf8(std::move(bytes)));
}

void DecodeByteFallback(std::vector<std::string>& tokens) {
  std::vector<std::string> result;
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    std::string checked;
    std::vector<uint32_t> positions;
    if (!SanitizeUtf8(pending, &checked, &positions)) {
      result.push_back(pending);
    } else {
      for (size_t i = 0; i < pending.size(); ++i) result.push_back("\xEF\xBF\xBD");
    }
    pending.clear();
  };
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::string& token : tokens) {
    if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>' &&
        hex(token[3]) >= 0 && hex(token[4]) >= 0) {
      pending.push_back(static_cast<char>(hex(token[3]) * 16 + hex(token[4])));
      continue;
    }
    flush();
    result.push_back(std::move(token));
  }
  flush();
  tokens.swap(result);
}

std::vector<std::string_view> Chars(std::string_view text) {
  std::vector<std::string_view> chars;
  for (size_t i = 0; i < text.size();) {
    const size_t length = std::min(Utf8CharLength(static_cast<uint8_t>(text[i])), text.size() - i);
    chars.push_back(text.substr(i, length));
    i += length;
  }
  return chars;
}

void DecodeStrip(const Decoder& decoder, std::vector<std::string>& tokens) {
  for (std::string& token : tokens) {
    const std::vector<std::string_view> chars = Chars(token);
    size_t start_cut = 0, stop_cut = 0;
    while (start_cut < decoder.strip_start && start_cut < chars.size() &&
           chars[start_cut] == decoder.content) {
      ++start_cut;
    }
    while (stop_cut < decoder.strip_stop && stop_cut < chars.size() - start_cut &&
           chars[chars.size() - 1 - stop_cut] == decoder.content) {
      ++stop_cut;
    }
    std::string stripped;
    for (size_t i = start_cut; i < chars.size() - stop_cut; ++i) stripped += chars[i];
    token = std::move(stripped);
  }
}

void DecodeReplace(const Decoder& decoder, std::vector<std::string>& tokens) {
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  for (std::string& token : tokens) {
    matches.clear();
    decoder.pattern.FindAll(token, matches);
    if (matches.empty()) continue;
    std::string replaced;
    size_t last = 0;
    for (const auto& [start, end] : matches) {
      replaced.append(token, last, start - last);
      replaced += decoder.content;
      last = end;
    }
    replaced.append(token, last);
    token = std::move(replaced);
  }
}

void DecodeMetaspace(const Decoder& decoder, std::vector<std::string>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string decoded;
    for (const std::string_view c : Chars(tokens[i])) {
      if (c == decoder.content) {
        if (i != 0 || !decoder.prepend_first) decoded.push_back(' ');
      } else {
        decoded += c;
      }
    }
    tokens[i] = std::move(decoded);
  }
}

}  // namespace

void DecodeChain(const Decoder& decoder, std::vector<std::string>& tokens) {
  switch (decoder.type) {
    case Decoder::Type::kSequence:
      for (const Decoder& child : decoder.children) DecodeChain(child, tokens);
      return;
    case Decoder::Type::kByteLevel:
      DecodeByteLevel(tokens);
      return;
    case Decoder::Type::kByteFallback:
      DecodeByteFallback(tokens);
      return;
    case Decoder::Type::kFuse: {
      std::string fused;
      for (const std::string& token : tokens) fused += token;
      tokens.assign(1, std::move(fused));
      return;
    }
    case Decoder::Type::kStrip:
      DecodeStrip(decoder, tokens);
      return;
    case Decoder::Type::kReplace:
      DecodeReplace(decoder, tokens);
      return;
    case Decoder::Type::kMetaspace:
      DecodeMetaspace(decoder, tokens);
      return;
  }
}

}  // namespace tokenizer_internal

std::string Tokenizer::Decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  const TokenizerImpl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const uint32_t id : ids) {
    if (auto it = impl.added_by_id.find(id); it != impl.added_by_id.end()) {
      const auto& token = impl.added_tokens[it->second];
      if (!(skip_special_tokens && token.special)) tokens.push_back(token.content);
      continue;
    }
    const auto& id_to_token = impl.model->id_to_token();
    if (id < id_to_token.size() && !id_to_token[id].empty()) tokens.push_back(id_to_token[id]);
  }
  std::string text;
  if (impl.decoder) {
    tokenizer_internal::DecodeChain(*impl.decoder, tokens);
    for (const std::string& token : tokens) text += token;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
  }
  return text;
}

std::optional<uint32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
    return it->second;
  }
  const auto& vocab = impl_->model->vocab();
  if (auto it = vocab.find(token); it != vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(uint32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
    return impl_->added_tokens[it->second].content;
  }
  const auto& id_to_token = impl_->model->id_to_token();
  if (id < id_to_token.size() && !id_to_token[id].empty()) return id_to_token[id];
  return std::nullopt;
}

uint32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::IsSpecial(uint32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added_tokens[it->second].special;
}

std::string Tokenizer::Describe() const { return impl_->description; }

}  // namespace tidal::data
