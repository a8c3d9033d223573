// common/strings.h — small string helpers shared by the HTTP layer, the S3 signer and the
// local API server, and the engine's error messages. Header-only, no dependencies.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace tidal {

// The first line of `text`: LibTorch's exception messages carry a C++ backtrace after it.
inline std::string FirstLine(std::string_view text) {
  return std::string(text.substr(0, text.find('\n')));
}

// ASCII lowercase (header names, kinds): bytes outside A–Z are kept as they are.
inline std::string AsciiLower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace tidal
