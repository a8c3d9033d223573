// common/flags.h — command-line flag values for the project's CLIs, with the message every
// bad value gets: the flag, what was expected and what was given.
#pragma once

#include <charconv>
#include <string>

#include "common/status.h"

namespace tidal {

// The whole of `text` as an integer >= `min`.
template <typename T>
StatusOr<T> ParseIntFlag(const std::string& flag, const std::string& text, T min) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min)
    return InvalidArgument(flag + ": expected an integer >= " + std::to_string(min) + ", got \"" +
                           text + "\"");
  return value;
}

}  // namespace tidal
