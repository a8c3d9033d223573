// worker/data/jinja_lexer.cc — mirrors jinja2/lexer.py's root/block/variable/comment/raw rules
// for the environment transformers builds (trim_blocks, lstrip_blocks, keep_trailing_newline
// off): "-" strips all whitespace on that side of a tag, "+" keeps it, lstrip_blocks removes the
// indentation before {% and {# that start a line, trim_blocks removes the newline after %} and #}.
#include "worker/data/jinja_lexer.h"

#include <cstring>

#include "common/utf8.h"

namespace tidal::data::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

std::string RStrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0 && IsSpace(s[end - 1])) --end;
  return std::string(s.substr(0, end));
}

// lstrip_blocks: drop the spaces between the last newline (or a line start) and the tag.
std::string LStripBlock(std::string_view text, bool line_starting) {
  size_t newline = text.rfind('\n');
  size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
  if (l_pos == 0 && !line_starting) return std::string(text);
  std::string_view rest = text.substr(l_pos);
  if (rest.empty()) return std::string(text);
  for (char c : rest) {
    if (!IsSpace(c)) return std::string(text);
  }
  return std::string(text.substr(0, l_pos));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body (unknown escapes kept).
std::string Unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t cp = 0;
        bool ok = true;
        for (size_t k = 1; ok && k <= digits; ++k) {
          if (i + k >= body.size() || HexValue(body[i + k]) < 0) {
            ok = false;
            break;
          }
          cp = cp * 16 + static_cast<uint32_t>(HexValue(body[i + k]));
        }
        if (!ok || cp > 0x10FFFF) {
          out += '\\';
          out += e;
        } else {
          AppendUtf8(out, cp);
          i += digits;
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          AppendUtf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      size_t p = pos_;
      for (;;) {
        p = src_.find('{', p);
        if (p == std::string::npos || p + 1 >= src_.size()) {
          p = std::string::npos;
          break;
        }
        char k = src_[p + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++p;
      }
      if (p == std::string::npos) {
        Emit(Token::Type::kData, src_.substr(pos_));
        Advance(src_.size());
        break;
      }
      char kind = src_[p + 1];
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      std::string_view text(src_.data() + pos_, p - pos_);
      std::string data;
      if (sign == '-') {
        data = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        data = LStripBlock(text, line_starting_);
      } else {
        data = std::string(text);
      }
      if (!data.empty()) Emit(Token::Type::kData, std::move(data));
      Advance(p);
      Status status;
      if (kind == '#') {
        status = Comment(q);
      } else if (kind == '%' && IsRaw(q)) {
        status = Raw(q);
      } else {
        status = Tag(kind, q);
      }
      if (!status.ok()) return status;
    }
    tokens_.push_back({Token::Type::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Type type, std::string value) {
    tokens_.push_back({type, std::move(value), line_});
  }
  // Moves to `to`, counting lines.
  void Advance(size_t to) {
    for (size_t i = pos_; i < to && i < src_.size(); ++i) {
      if (src_[i] == '\n') ++line_;
    }
    pos_ = to;
  }
  Status Fail(const std::string& message) const {
    return InvalidArgument("template line " + std::to_string(line_) + ": " + message);
  }
  bool StartsWith(size_t at, const char* s) const {
    return src_.compare(at, std::strlen(s), s) == 0;
  }
  size_t SkipSpaces(size_t at) const {
    while (at < src_.size() && IsSpace(src_[at])) ++at;
    return at;
  }
  // After a tag's end delimiter (ending at `at`): "-" strips what follows, trim_blocks one newline.
  void FinishTag(size_t at, char end_sign, bool trim_newline) {
    if (end_sign == '-') {
      at = SkipSpaces(at);
    } else if (end_sign != '+' && trim_newline && at < src_.size() && src_[at] == '\n') {
      ++at;
    }
    line_starting_ = at > 0 && src_[at - 1] == '\n';
    Advance(at);
  }

  Status Comment(size_t q) {
    size_t e = src_.find("#}", q);
    if (e == std::string::npos) return Fail("missing end of comment tag");
    char end_sign = (e > q && (src_[e - 1] == '-' || src_[e - 1] == '+')) ? src_[e - 1] : 0;
    FinishTag(e + 2, end_sign, true);
    return OkStatus();
  }

  // {%[-+]? raw [-]?%}
  bool IsRaw(size_t q) const {
    size_t at = SkipSpaces(q);
    if (!StartsWith(at, "raw")) return false;
    at = SkipSpaces(at + 3);
    return StartsWith(at, "%}") || StartsWith(at, "-%}");
  }

  Status Raw(size_t q) {
    size_t at = SkipSpaces(SkipSpaces(q) + 3);
    bool strip_after = src_[at] == '-';
    at += strip_after ? 3 : 2;
    if (strip_after) at = SkipSpaces(at);
    line_starting_ = at > 0 && src_[at - 1] == '\n';
    Advance(at);
    // Find {%[-+]?\s*endraw\s*[-+]?%}
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t k = p + 2;
      char sign = 0;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) sign = src_[k++];
      k = SkipSpaces(k);
      if (!StartsWith(k, "endraw")) continue;
      k = SkipSpaces(k + 6);
      char end_sign = 0;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) end_sign = src_[k++];
      if (!StartsWith(k, "%}")) continue;
      std::string_view text(src_.data() + pos_, p - pos_);
      std::string data = sign == '-'   ? RStrip(text)
                         : sign != '+' ? LStripBlock(text, line_starting_)
                                       : std::string(text);
      if (!data.empty()) Emit(Token::Type::kData, std::move(data));
      Advance(p);
      FinishTag(k + 2, end_sign, true);
      return OkStatus();
    }
    return Fail("missing end of raw directive");
  }

  Status Tag(char kind, size_t q) {
    bool block = kind == '%';
    Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "");
    Advance(q);
    int depth = 0;  // open brackets: end delimiters inside them do not close the tag
    for (;;) {
      Advance(SkipSpaces(pos_));
      if (pos_ >= src_.size()) return Fail("unexpected end of template, expected end of tag");
      if (depth == 0) {
        const char* end = block ? "%}" : "}}";
        char end_sign = 0;
        size_t at = pos_;
        if ((src_[at] == '-' || (block && src_[at] == '+')) && StartsWith(at + 1, end)) {
          end_sign = src_[at++];
        }
        if (StartsWith(at, end)) {
          Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "");
          FinishTag(at + 2, end_sign, block);
          return OkStatus();
        }
      }
      char c = src_[pos_];
      if (c == '\'' || c == '"') {
        size_t i = pos_ + 1;
        while (i < src_.size() && src_[i] != c) i += src_[i] == '\\' ? 2 : 1;
        if (i >= src_.size()) return Fail("unterminated string literal");
        Emit(Token::Type::kString, Unescape(std::string_view(src_).substr(pos_ + 1, i - pos_ - 1)));
        Advance(i + 1);
      } else if (IsDigit(c)) {
        size_t i = pos_;
        while (i < src_.size() && (IsDigit(src_[i]) || src_[i] == '_')) ++i;
        bool is_float = false;
        if (i + 1 < src_.size() && src_[i] == '.' && IsDigit(src_[i + 1])) {
          is_float = true;
          ++i;
          while (i < src_.size() && (IsDigit(src_[i]) || src_[i] == '_')) ++i;
        }
        if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
          size_t j = i + 1;
          if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
          if (j < src_.size() && IsDigit(src_[j])) {
            is_float = true;
            i = j;
            while (i < src_.size() && IsDigit(src_[i])) ++i;
          }
        }
        std::string number;
        for (size_t k = pos_; k < i; ++k) {
          if (src_[k] != '_') number += src_[k];
        }
        Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, number);
        Advance(i);
      } else if (IsNameStart(c)) {
        size_t i = pos_;
        while (i < src_.size() && IsNameChar(src_[i])) ++i;
        Emit(Token::Type::kName, src_.substr(pos_, i - pos_));
        Advance(i);
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* two : kTwo) {
          if (StartsWith(pos_, two)) op = two;
        }
        if (op.empty()) {
          if (std::strchr("+-/*%~[](){}<>=.:|,;", c) == nullptr) {
            return Fail(std::string("unexpected character '") + c + "'");
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        Emit(Token::Type::kOp, op);
        Advance(pos_ + op.size());
      }
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  // As Jinja2: newlines normalised to \n, one trailing newline dropped.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).Run();
}

}  // namespace tidal::data::jinja
