// worker/data/tokenizer_pretokenize.cc — the pre-tokenizers of tokenizer.json (Split with its
// five behaviours, ByteLevel, Digits, Metaspace, Sequence) and the added-token matcher that runs
// before them, each as the `tokenizers` crate does it.
#include <algorithm>

#include "worker/data/tokenizer_internal.h"

namespace tidal::data::tokenizer_internal {

// ---- Pre-tokenizers ------------------------------------------------------------------------

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// HF's NormalizedString::split: `matches` (is_match per range) cover the text in order.
void SplitByBehavior(const Piece& piece, std::vector<std::pair<Ranges::value_type, bool>>& parts,
                     SplitBehavior behavior, std::vector<Piece>& out) {
  std::vector<std::pair<uint32_t, uint32_t>> kept;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [range, is_match] : parts) kept.push_back(range);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [range, is_match] : parts)
        if (!is_match) kept.push_back(range);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [range, is_match] : parts) {
        if (is_match && !previous_match && !kept.empty()) {
          kept.back().second = range.second;
        } else {
          kept.push_back(range);
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !previous_match && !kept.empty()) {
          kept.back().first = it->first.first;
        } else {
          kept.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [range, is_match] : parts) {
        if (is_match == previous_match && !kept.empty()) {
          kept.back().second = range.second;
        } else {
          kept.push_back(range);
        }
        previous_match = is_match;
      }
      break;
    }
  }
  for (const auto& [start, end] : kept) {
    if (end > start) out.push_back(piece.Sub(start, end));
  }
}

void SplitOnMatches(const Piece& piece, const Ranges& matches, bool invert, SplitBehavior behavior,
                    std::vector<Piece>& out) {
  // The common case, Isolated without inversion: every part on its own.
  if (behavior == SplitBehavior::kIsolated) {
    uint32_t previous = 0;
    for (const auto& [start, end] : matches) {
      if (start > previous) out.push_back(piece.Sub(previous, start));
      out.push_back(piece.Sub(start, end));
      previous = end;
    }
    if (previous < piece.text.size()) out.push_back(piece.Sub(previous, piece.text.size()));
    return;
  }
  std::vector<std::pair<Ranges::value_type, bool>> parts;
  uint32_t previous = 0;
  for (const auto& [start, end] : matches) {
    if (start > previous) parts.push_back({{previous, start}, invert});
    parts.push_back({{start, end}, !invert});
    previous = end;
  }
  const auto size = static_cast<uint32_t>(piece.text.size());
  if (previous < size) parts.push_back({{previous, size}, invert});
  SplitByBehavior(piece, parts, behavior, out);
}

void DigitMatches(std::string_view text, bool individual, Ranges& matches) {
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const size_t length = DecodeUtf8(text, i, &c);
    if (IsUnicodeNumeric(c)) {
      if (!individual && !matches.empty() && matches.back().second == i) {
        matches.back().second = static_cast<uint32_t>(i + length);
      } else {
        matches.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + length));
      }
    }
    i += length;
  }
}

const Pattern& Gpt2Pattern() {
  static const Pattern pattern = [] {
    Pattern p;
    p.regex = *Regex::Compile(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
    return p;
  }();
  return pattern;
}

void PreTokenizeOne(const PreTokenizer& pre, const Piece& piece, Scratch& scratch,
                    std::vector<Piece>& out) {
  Ranges& matches = scratch.matches;
  matches.clear();
  switch (pre.type) {
    case PreTokenizer::Type::kSequence:
      out.push_back(piece);
      return;
    case PreTokenizer::Type::kSplit:
      pre.pattern.FindAll(piece.text, matches);
      SplitOnMatches(piece, matches, pre.invert, pre.behavior, out);
      return;
    case PreTokenizer::Type::kDigits:
      DigitMatches(piece.text, pre.individual_digits, matches);
      SplitOnMatches(piece, matches, false,
                     pre.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                     out);
      return;
    case PreTokenizer::Type::kByteLevel: {
      Piece current = piece;
      if (pre.add_prefix_space && !current.text.starts_with(' ')) {
        current = PrependToPiece(" ", current, scratch);
      }
      current.byte_level = true;
      if (!pre.use_regex) {
        out.push_back(current);
        return;
      }
      Gpt2Pattern().FindAll(current.text, matches);
      SplitOnMatches(current, matches, false, SplitBehavior::kIsolated, out);
      return;
    }
    case PreTokenizer::Type::kMetaspace: {
      Piece current = piece;
      if (current.text.find(' ') != std::string_view::npos) {
        Pattern space;
        space.literal = " ";
        current = ReplaceInPiece(space, pre.replacement, current, scratch);
      }
      const bool prepend = pre.prepend_scheme == PreTokenizer::Prepend::kAlways ||
                           (pre.prepend_scheme == PreTokenizer::Prepend::kFirst &&
                            !current.text.empty() && current.Original(0, 1).start == 0);
      if (prepend && !current.text.starts_with(pre.replacement)) {
        current = PrependToPiece(pre.replacement, current, scratch);
      }
      if (!pre.split) {
        out.push_back(current);
        return;
      }
      Pattern replacement;
      replacement.literal = pre.replacement;
      replacement.FindAll(current.text, matches);
      SplitOnMatches(current, matches, false, SplitBehavior::kMergedWithNext, out);
      return;
    }
  }
}

}  // namespace

void PreTokenize(const PreTokenizer& pre, std::vector<Piece>& pieces, Scratch& scratch) {
  if (pre.type == PreTokenizer::Type::kSequence) {
    for (const PreTokenizer& child : pre.children) PreTokenize(child, pieces, scratch);
    return;
  }
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (const Piece& piece : pieces) {
    if (piece.token_id >= 0) {
      out.push_back(piece);
    } else {
      PreTokenizeOne(pre, piece, scratch, out);
    }
  }
  pieces.swap(out);
}

// ---- Added tokens --------------------------------------------------------------------------

void AddedTokenMatcher::Build(const std::vector<AddedToken>& tokens, bool normalized) {
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const AddedToken& token = tokens[t];
    if (token.normalized != normalized || token.content.empty()) continue;
    uint32_t node = 0;
    for (const char ch : token.content) {
      const auto byte = static_cast<uint8_t>(ch);
      auto& next = nodes_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), byte,
                                 [](const auto& entry, uint8_t b) { return entry.first < b; });
      if (it != next.end() && it->first == byte) {
        node = it->second;
      } else {
        const auto child = static_cast<uint32_t>(nodes_.size());
        next.insert(it, {byte, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int64_t>(t);
    first_byte_[static_cast<uint8_t>(token.content[0])] = true;
  }
}

namespace {

char32_t LastChar(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && IsUtf8Continuation(static_cast<uint8_t>(text[start]))) --start;
  char32_t c;
  DecodeUtf8(text, start, &c);
  return c;
}

}  // namespace

void AddedTokenMatcher::Split(const Piece& piece, const std::vector<AddedToken>& tokens,
                              std::vector<Piece>& out) const {
  const std::string_view text = piece.text;
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    uint32_t node = 0;
    int64_t found = -1;
    size_t found_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      const auto byte = static_cast<uint8_t>(text[k]);
      const auto& next = nodes_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), byte,
                                 [](const auto& entry, uint8_t b) { return entry.first < b; });
      if (it == next.end() || it->first != byte) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = k + 1;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens[static_cast<size_t>(found)];
    size_t start = i, stop = found_end;
    i = found_end;  // as the Aho-Corasick iterator, even when the match is rejected below
    if (token.single_word) {
      const bool start_space = start == 0 || !IsRegexWordCharacter(LastChar(text.substr(0, start)));
      bool stop_space = stop == text.size();
      if (!stop_space) {
        char32_t c;
        DecodeUtf8(text, stop, &c);
        stop_space = !IsRegexWordCharacter(c);
      }
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t prev = new_start - 1;
        while (prev > 0 && IsUtf8Continuation(static_cast<uint8_t>(text[prev]))) --prev;
        char32_t c;
        DecodeUtf8(text, prev, &c);
        if (!IsUnicodeWhitespace(c)) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        char32_t c;
        const size_t length = DecodeUtf8(text, stop, &c);
        if (!IsUnicodeWhitespace(c)) break;
        stop += length;
      }
    }
    if (start_offset < start) out.push_back(piece.Sub(start_offset, start));
    Piece matched = piece.Sub(start, stop);
    matched.token_id = token.id;
    out.push_back(matched);
    start_offset = stop;
  }
  if (start_offset < text.size() || text.empty()) {
    out.push_back(piece.Sub(start_offset, text.size()));
  }
}

}  // namespace tidal::data::tokenizer_internal
