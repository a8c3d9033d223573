// worker/data/tokenizer_normalize.cc — normalized text with HF's alignments (each normalized
// byte knows the original range it came from) and the normalizers of tokenizer.json: the
// Unicode forms through ICU, Replace, Prepend, Sequence.
#include <algorithm>
#include <span>

#include <unicode/bytestream.h>
#include <unicode/edits.h>
#include <unicode/normalizer2.h>

#include "worker/data/tokenizer_internal.h"
#include "worker/data/unicode_additions.h"

namespace tidal::data::tokenizer_internal {

// ---- Pieces --------------------------------------------------------------------------------

Align Piece::Original(size_t start, size_t end) const {
  if (align != nullptr) return {align[start].start, align[end - 1].end};
  // Unchanged text: a byte stands for its whole character (HF's alignments of a fresh string).
  while (start > 0 && IsUtf8Continuation(static_cast<uint8_t>(text[start]))) --start;
  while (end < text.size() && IsUtf8Continuation(static_cast<uint8_t>(text[end]))) ++end;
  return {base + static_cast<uint32_t>(start), base + static_cast<uint32_t>(end)};
}

void Scratch::Materialize(const Piece& piece, std::string& text, std::vector<Align>& align) const {
  text.assign(piece.text);
  align.resize(text.size());
  if (piece.align != nullptr) {
    std::copy(piece.align, piece.align + text.size(), align.begin());
    return;
  }
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8CharLength(static_cast<uint8_t>(text[i]));
    const Align a = {piece.base + static_cast<uint32_t>(i),
                     piece.base + static_cast<uint32_t>(i + length)};
    for (size_t k = 0; k < length && i + k < text.size(); ++k) align[i + k] = a;
    i += length;
  }
}

Piece Scratch::Own(std::string text, std::vector<Align> align, const Piece& like) {
  Piece piece = like;
  texts.push_back(std::move(text));
  aligns.push_back(std::move(align));
  piece.text = texts.back();
  piece.align = aligns.back().data();
  piece.base = 0;
  return piece;
}

// ---- Normalizers ---------------------------------------------------------------------------

namespace {

bool InRanges(std::span<const CodePointRange> ranges, char32_t c) {
  auto it =
      std::upper_bound(ranges.begin(), ranges.end(), c,
                       [](char32_t value, const CodePointRange& r) { return value < r.first; });
  return it != ranges.begin() && c <= std::prev(it)->last;
}

// Normalizes text[start, end) onto `out`, with the alignments of the new bytes. As HF
// (unicode-normalization-alignments): within each change, the k-th new character stands for
// the k-th old one (the last old one when there are more new characters), so "e\u0301"
// composed to "\u00e9" comes from the "e", and "\ufb01" decomposed to "fi" from the ligature.
void NormalizeSegment(const icu::Normalizer2& form, std::string_view text,
                      const std::vector<Align>& old_align, size_t start, size_t end,
                      std::string& out, std::vector<Align>& align) {
  if (start == end) return;
  const icu::StringPiece source(text.data() + start, static_cast<int32_t>(end - start));
  UErrorCode status = U_ZERO_ERROR;
  std::string normalized;
  icu::StringByteSink<std::string> sink(&normalized);
  icu::Edits edits;
  form.normalizeUTF8(0, source, sink, &edits, status);
  if (U_FAILURE(status)) {  // cannot happen on valid UTF-8; keep the text as it is
    out.append(text.substr(start, end - start));
    align.insert(align.end(), old_align.begin() + start, old_align.begin() + end);
    return;
  }
  icu::Edits::Iterator it = edits.getFineIterator();
  while (it.next(status)) {
    const size_t old_start = start + static_cast<size_t>(it.sourceIndex());
    const size_t old_length = static_cast<size_t>(it.oldLength());
    const size_t new_start = static_cast<size_t>(it.destinationIndex());
    const size_t new_length = static_cast<size_t>(it.newLength());
    if (!it.hasChange()) {
      align.insert(align.end(), old_align.begin() + old_start,
                   old_align.begin() + old_start + old_length);
      continue;
    }
    std::vector<Align> old_chars;  // one per old character
    for (size_t i = old_start; i < old_start + old_length;) {
      old_chars.push_back(old_align[i]);
      i += Utf8CharLength(static_cast<uint8_t>(text[i]));
    }
    if (old_chars.empty()) old_chars.push_back(old_align[old_start > 0 ? old_start - 1 : 0]);
    size_t k = 0;
    for (size_t i = new_start; i < new_start + new_length; ++k) {
      const size_t length = Utf8CharLength(static_cast<uint8_t>(normalized[i]));
      align.insert(align.end(), length, old_chars[std::min(k, old_chars.size() - 1)]);
      i += length;
    }
  }
  out += normalized;
}

// `unchanged`: code points HF's (older) tables leave alone; the text between them is normalized
// by ICU, they are copied (unicode_additions.h).
Piece UnicodeNormalize(const icu::Normalizer2& form, std::span<const CodePointRange> unchanged,
                       const Piece& piece, Scratch& scratch) {
  const bool ascii = std::all_of(piece.text.begin(), piece.text.end(),
                                 [](char c) { return static_cast<uint8_t>(c) < 0x80; });
  if (ascii) return piece;
  bool has_unchanged = false;
  for (size_t i = 0; i < piece.text.size() && !has_unchanged;) {
    char32_t c;
    i += DecodeUtf8(piece.text, i, &c);
    has_unchanged = c >= unchanged.front().first && InRanges(unchanged, c);
  }
  UErrorCode status = U_ZERO_ERROR;
  if (!has_unchanged &&
      form.isNormalizedUTF8(
          icu::StringPiece(piece.text.data(), static_cast<int32_t>(piece.text.size())), status) &&
      U_SUCCESS(status)) {
    return piece;
  }
  std::string text;
  std::vector<Align> old_align;
  scratch.Materialize(piece, text, old_align);
  std::string out;
  std::vector<Align> align;
  out.reserve(text.size());
  align.reserve(text.size());
  size_t segment = 0;
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const size_t length = DecodeUtf8(text, i, &c);
    if (c >= unchanged.front().first && InRanges(unchanged, c)) {
      NormalizeSegment(form, text, old_align, segment, i, out, align);
      out.append(text, i, length);
      align.insert(align.end(), old_align.begin() + i, old_align.begin() + i + length);
      segment = i + length;
    }
    i += length;
  }
  NormalizeSegment(form, text, old_align, segment, text.size(), out, align);
  return scratch.Own(std::move(out), std::move(align), piece);
}

}  // namespace

Piece ReplaceInPiece(const Pattern& pattern, const std::string& content, const Piece& piece,
                     Scratch& scratch) {
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  pattern.FindAll(piece.text, matches);
  if (matches.empty()) return piece;
  std::string text;
  std::vector<Align> align;
  size_t last = 0;
  for (const auto& [start, end] : matches) {
    text.append(piece.text.substr(last, start - last));
    for (size_t i = last; i < start; ++i) align.push_back(piece.Original(i, i + 1));
    // As HF's NormalizedString::replace (through transform_range): the new text takes the
    // alignment of the last character it replaces.
    const Align last_char = piece.Original(end - 1, end);
    text.append(content);
    align.insert(align.end(), content.size(), last_char);
    last = end;
  }
  text.append(piece.text.substr(last));
  for (size_t i = last; i < piece.text.size(); ++i) align.push_back(piece.Original(i, i + 1));
  return scratch.Own(std::move(text), std::move(align), piece);
}

// HF's NormalizedString::prepend: the new text stands for the first character.
Piece PrependToPiece(const std::string& prefix, const Piece& piece, Scratch& scratch) {
  if (piece.text.empty()) return piece;
  std::string text;
  std::vector<Align> align;
  scratch.Materialize(piece, text, align);
  const Align first = align[0];
  text.insert(0, prefix);
  align.insert(align.begin(), prefix.size(), first);
  return scratch.Own(std::move(text), std::move(align), piece);
}

namespace {

std::span<const CodePointRange> HfUnchanged(Normalizer::Type type) {
  switch (type) {
    case Normalizer::Type::kNfc:
      return kHfNfcUnchanged;
    case Normalizer::Type::kNfkc:
      return kHfNfkcUnchanged;
    case Normalizer::Type::kNfd:
      return kHfNfdUnchanged;
    default:
      return kHfNfkdUnchanged;
  }
}

const icu::Normalizer2* Form(Normalizer::Type type) {
  UErrorCode status = U_ZERO_ERROR;
  switch (type) {
    case Normalizer::Type::kNfc:
      return icu::Normalizer2::getNFCInstance(status);
    case Normalizer::Type::kNfkc:
      return icu::Normalizer2::getNFKCInstance(status);
    case Normalizer::Type::kNfd:
      return icu::Normalizer2::getNFDInstance(status);
    case Normalizer::Type::kNfkd:
      return icu::Normalizer2::getNFKDInstance(status);
    default:
      return nullptr;
  }
}

}  // namespace

Piece Normalize(const Normalizer& normalizer, const Piece& piece, Scratch& scratch) {
  switch (normalizer.type) {
    case Normalizer::Type::kSequence: {
      Piece current = piece;
      for (const Normalizer& child : normalizer.children) {
        current = Normalize(child, current, scratch);
      }
      return current;
    }
    case Normalizer::Type::kNfc:
    case Normalizer::Type::kNfkc:
    case Normalizer::Type::kNfd:
    case Normalizer::Type::kNfkd: {
      const icu::Normalizer2* form = Form(normalizer.type);
      return form == nullptr
                 ? piece
                 : UnicodeNormalize(*form, HfUnchanged(normalizer.type), piece, scratch);
    }
    case Normalizer::Type::kReplace:
      return ReplaceInPiece(normalizer.pattern, normalizer.content, piece, scratch);
    case Normalizer::Type::kPrepend:
      return PrependToPiece(normalizer.content, piece, scratch);
  }
  return piece;
}

}  // namespace tidal::data::tokenizer_internal
