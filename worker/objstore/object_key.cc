// worker/objstore/object_key.cc
#include "worker/objstore/object_key.h"

#include <string>

namespace tidal::objstore {
namespace {

// Length of the UTF-8 sequence starting at s[i], or 0 when it is not well-formed
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

Status Invalid(std::string_view what, std::string_view key, const std::string& why) {
  return InvalidArgument(std::string(what) + " \"" + std::string(key) + "\": " + why);
}

// The checks keys and prefixes share; `partial_last` allows a trailing '/' (an empty last
// segment) and a last segment that is only the start of a name.
Status ValidatePath(std::string_view what, std::string_view key, bool partial_last) {
  if (key.size() > kMaxKeyBytes)
    return Invalid(what, key.substr(0, 64),
                   "longer than " + std::to_string(kMaxKeyBytes) + " bytes (S3's limit)");
  for (size_t i = 0; i < key.size();) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c == 0x7F)
      return Invalid(what, key, "control character at byte " + std::to_string(i));
    size_t n = Utf8SequenceLength(key, i);
    if (n == 0) return Invalid(what, key, "not valid UTF-8 at byte " + std::to_string(i));
    i += n;
  }
  if (!key.empty() && key.front() == '/')
    return Invalid(what, key, "must be relative (no leading '/')");
  size_t start = 0;
  while (start <= key.size()) {
    size_t slash = key.find('/', start);
    bool last = slash == std::string_view::npos;
    std::string_view segment = key.substr(start, last ? std::string_view::npos : slash - start);
    if (segment.empty() && !(last && partial_last))
      return Invalid(what, key, "empty path segment (\"//\" or a trailing '/')");
    if ((segment == "." || segment == "..") && !(last && partial_last))
      return Invalid(what, key, "\".\" and \"..\" segments are not allowed");
    if (segment.substr(0, kTempPrefix.size()) == kTempPrefix)
      return Invalid(what, key,
                     "segments may not start with \"" + std::string(kTempPrefix) +
                         "\" (reserved for the file store's temporary files)");
    if (last) break;
    start = slash + 1;
  }
  return OkStatus();
}

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return InvalidArgument("object key is empty");
  return ValidatePath("object key", key, false);
}

Status ValidatePrefix(std::string_view prefix) {
  if (prefix.empty()) return OkStatus();
  return ValidatePath("list prefix", prefix, true);
}

}  // namespace tidal::objstore
