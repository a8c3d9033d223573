// worker/data/jinja_strings.h — Python str methods over UTF-8 text, shared by the str methods
// and the filters of jinja_builtins. Case mapping is ASCII-only (templates only case ASCII).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "worker/data/jinja_value.h"

namespace tidal::data::jinja::strings {

inline bool IsPySpace(char32_t c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// str.strip/lstrip/rstrip(chars): chars == nullptr strips whitespace.
inline std::string Strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string text = DecodeUtf8(s);
  std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strip = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end && strip(text[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(text[end - 1])) --end;
  }
  return EncodeUtf8(std::u32string_view(text).substr(begin, end - begin));
}

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (what chat
// templates meet); other code points are left as they are.
inline char32_t UpperChar(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
inline char32_t LowerChar(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
inline bool IsCased(char32_t c) { return UpperChar(c) != c || LowerChar(c) != c; }

inline std::string MapChars(std::string_view s, char32_t (*f)(char32_t)) {
  std::u32string text = DecodeUtf8(s);
  for (char32_t& c : text) c = f(c);
  return EncodeUtf8(text);
}
inline std::string Upper(std::string_view s) { return MapChars(s, UpperChar); }
inline std::string Lower(std::string_view s) { return MapChars(s, LowerChar); }
inline bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// str.title(): a cased letter after an uncased character is upper-cased, others lower-cased.
inline std::string Title(std::string_view s) {
  std::u32string text = DecodeUtf8(s);
  bool previous_cased = false;
  for (char32_t& c : text) {
    if (IsCased(c)) {
      c = previous_cased ? LowerChar(c) : UpperChar(c);
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return EncodeUtf8(text);
}
// Jinja's title filter: words begin after whitespace, '-', or an opening bracket.
inline std::string TitleFilter(std::string_view s) {
  std::u32string text = DecodeUtf8(s);
  bool word_start = true;
  for (char32_t& c : text) {
    bool separator = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    c = word_start ? UpperChar(c) : LowerChar(c);
    word_start = false;
  }
  return EncodeUtf8(text);
}
inline std::string Capitalize(std::string_view s) {
  std::u32string text = DecodeUtf8(s);
  for (size_t i = 0; i < text.size(); ++i)
    text[i] = i == 0 ? UpperChar(text[i]) : LowerChar(text[i]);
  return EncodeUtf8(text);
}

// str.split(sep, maxsplit); sep == nullptr splits on runs of whitespace.
inline std::vector<std::string> Split(std::string_view s, const std::string* sep,
                                      int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep == nullptr) {
    std::u32string text = DecodeUtf8(s);
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && IsPySpace(text[i])) ++i;
      if (i >= text.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        size_t end = text.size();
        while (end > i && IsPySpace(text[end - 1])) --end;
        parts.push_back(EncodeUtf8(std::u32string_view(text).substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < text.size() && !IsPySpace(text[j])) ++j;
      parts.push_back(EncodeUtf8(std::u32string_view(text).substr(i, j - i)));
      i = j;
    }
    return parts;
  }
  size_t start = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) break;
    size_t at = s.find(*sep, start);
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, at - start));
    start = at + sep->size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

// str.rsplit(sep, maxsplit) with an explicit separator.
inline std::vector<std::string> RSplit(std::string_view s, const std::string& sep,
                                       int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t end = s.size();
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) break;
    if (end < sep.size()) break;
    size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string_view::npos) break;
    parts.emplace(parts.begin(), s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  parts.emplace(parts.begin(), s.substr(0, end));
  return parts;
}

inline std::string Replace(std::string_view s, std::string_view old, std::string_view with,
                           int64_t count) {
  std::string out;
  if (old.empty()) {
    std::u32string text = DecodeUtf8(s);
    int64_t done = 0;
    for (char32_t c : text) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += EncodeUtf8(std::u32string(1, c));
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += with;
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

// str.splitlines() (without keepends).
inline std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> lines;
  std::u32string text = DecodeUtf8(s);
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char32_t c = text[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                    c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    lines.push_back(EncodeUtf8(std::u32string_view(text).substr(start, i - start)));
    if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < text.size()) lines.push_back(EncodeUtf8(std::u32string_view(text).substr(start)));
  return lines;
}

}  // namespace tidal::data::jinja::strings
