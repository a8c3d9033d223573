// worker/data/tokenizer_text.cc — the text primitives of the tokenizer: UTF-8 decoding and
// sanitising (Python's errors='replace'), the Unicode properties the Rust code asks of chars
// (ICU), GPT-2's byte-level alphabet, and PCRE2 regexes with Oniguruma's meaning.
#include <algorithm>
#include <cstdio>
#include <cstring>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>

#include "worker/data/tokenizer_internal.h"
#include "worker/data/unicode_additions.h"

namespace tidal::data::tokenizer_internal {

// ---- UTF-8 ---------------------------------------------------------------------------------

size_t DecodeUtf8(std::string_view text, size_t pos, char32_t* code_point) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  if (s[0] < 0x80) {
    *code_point = s[0];
    return 1;
  }
  if (s[0] < 0xE0) {
    *code_point = (char32_t(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (s[0] < 0xF0) {
    *code_point = (char32_t(s[0] & 0x0F) << 12) | (char32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return 3;
  }
  *code_point = (char32_t(s[0] & 0x07) << 18) | (char32_t(s[1] & 0x3F) << 12) |
                (char32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  return 4;
}

namespace {

// Length of the valid UTF-8 sequence at s[0..n), or 0 with *subpart set to the length of the
// maximal subpart (at least 1) to replace by one U+FFFD (Unicode 6.0 §3.9, WHATWG).
size_t ValidSequenceLength(const uint8_t* s, size_t n, size_t* subpart) {
  const uint8_t lead = s[0];
  if (lead < 0x80) return 1;
  size_t length;
  uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < length; ++i) {
    if (i >= n) break;
    const uint8_t lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (s[i] < lo || s[i] > hi) break;
  }
  if (i == length) return length;
  *subpart = i;
  return 0;
}

}  // namespace

bool SanitizeUtf8(std::string_view input, std::string* output,
                  std::vector<uint32_t>* original_pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(input.data());
  const size_t n = input.size();
  size_t i = 0, subpart = 0;
  // Fast scan: ASCII and valid sequences.
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t length = ValidSequenceLength(s + i, n - i, &subpart);
    if (length == 0) break;
    i += length;
  }
  if (i == n) return false;
  output->assign(input.data(), i);
  original_pos->resize(i);
  for (size_t k = 0; k < i; ++k) (*original_pos)[k] = static_cast<uint32_t>(k);
  while (i < n) {
    const size_t length = ValidSequenceLength(s + i, n - i, &subpart);
    if (length > 0) {
      for (size_t k = 0; k < length; ++k) {
        output->push_back(static_cast<char>(s[i + k]));
        original_pos->push_back(static_cast<uint32_t>(i + k));
      }
      i += length;
    } else {
      output->append("\xEF\xBF\xBD");
      for (int k = 0; k < 3; ++k) original_pos->push_back(static_cast<uint32_t>(i));
      i += subpart;
    }
  }
  original_pos->push_back(static_cast<uint32_t>(n));
  return true;
}

bool IsUnicodeWhitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool IsUnicodeNumeric(char32_t c) {
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER ||
         InUnicode16Additions('N', c);
}

bool IsRegexWordCharacter(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  const int8_t type = u_charType(cp);
  return u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || type == U_NON_SPACING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION ||
         u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL) || InUnicode16Additions('L', c) ||
         InUnicode16Additions('M', c);
}

// ---- Byte-level alphabet (GPT-2's bytes_to_unicode) --------------------------------------

namespace {
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> bytes;  // code points below 324 only
  ByteLevelTables() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? char32_t(b) : char32_t(256 + extra++);
      AppendUtf8(chars[b], c);
      bytes[c] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelTables& Tables() {
  static const ByteLevelTables tables;
  return tables;
}
}  // namespace

const std::array<std::string, 256>& ByteLevelChars() { return Tables().chars; }
int ByteLevelByte(char32_t c) { return c < 324 ? Tables().bytes[c] : -1; }

// ---- Regex ---------------------------------------------------------------------------------

namespace {

// Oniguruma's \s is Unicode White_Space, which has U+0085; PCRE2's (with UCP) has not. Its \h
// is a hex digit. The rest of the syntax the shipped files use (\p{..}, (?i:..), look-ahead,
// counted repeats, UTF-8 ranges) means the same in PCRE2.
std::string OnigurumaToPcre2(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 'p' && pattern.compare(i + 1, 1, "{") == 0 && i + 3 < pattern.size() &&
          pattern[i + 3] == '}' && !Unicode16Additions(pattern[i + 2]).empty()) {
        // \p{L} etc. with what Unicode 15 and 16 added (unicode_additions.h).
        out += in_class ? "" : "[";
        out += pattern.substr(i - 1, 5);
        for (const CodePointRange& range : Unicode16Additions(pattern[i + 2])) {
          char hex[48];
          std::snprintf(hex, sizeof(hex), "\\x{%X}-\\x{%X}", static_cast<unsigned>(range.first),
                        static_cast<unsigned>(range.last));
          out += hex;
        }
        out += in_class ? "" : "]";
        i += 3;
      } else if (e == 'h') {  // Oniguruma's \h is a hex digit (PCRE2's: horizontal space)
        out += in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
      } else if (e == 'H' && !in_class) {
        out += "[^0-9A-Fa-f]";
      } else if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// Per-thread PCRE2 state: match data and a JIT stack big enough for long whitespace runs.
struct MatchState {
  pcre2_match_data_8* data = pcre2_match_data_create_8(1, nullptr);
  pcre2_match_context_8* context = pcre2_match_context_create_8(nullptr);
  pcre2_jit_stack_8* stack = pcre2_jit_stack_create_8(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign_8(context, nullptr, stack); }
  ~MatchState() {
    pcre2_jit_stack_free_8(stack);
    pcre2_match_context_free_8(context);
    pcre2_match_data_free_8(data);
  }
};

}  // namespace

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(const std::string& pattern) {
  const std::string translated = OnigurumaToPcre2(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code_8* code =
      pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(translated.data()), translated.size(),
                      PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR8 message[256];
    pcre2_get_error_message_8(error, message, sizeof(message));
    return InvalidArgument("regex \"" + pattern + "\" does not compile at offset " +
                           std::to_string(error_offset) + ": " +
                           reinterpret_cast<const char*>(message));
  }
  std::shared_ptr<Regex> regex(new Regex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile_8(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const Regex>(std::move(regex));
}

Regex::~Regex() { pcre2_code_free_8(static_cast<pcre2_code_8*>(code_)); }

void Regex::FindAll(std::string_view text,
                    std::vector<std::pair<uint32_t, uint32_t>>& matches) const {
  thread_local MatchState state;
  auto* code = static_cast<pcre2_code_8*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR8>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = jit_ ? pcre2_jit_match_8(code, subject, text.size(), pos, 0, state.data, state.context)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match_8(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         state.data, nullptr);
    }
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer_8(state.data);
    const size_t start = ovector[0], end = ovector[1];
    if (end <= start) {  // empty: Oniguruma's iterator steps over one character
      if (start >= text.size()) break;
      pos = start + Utf8CharLength(static_cast<uint8_t>(text[start]));
      continue;
    }
    matches.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(end));
    pos = end;
  }
}

void Pattern::FindAll(std::string_view text,
                      std::vector<std::pair<uint32_t, uint32_t>>& matches) const {
  if (regex) {
    regex->FindAll(text, matches);
    return;
  }
  if (literal.empty()) return;
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    matches.emplace_back(static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + literal.size()));
    pos += literal.size();
  }
}

}  // namespace tidal::data::tokenizer_internal
