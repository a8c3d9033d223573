// common/flags.h — command-line flag values for the project's CLIs, with the message every
// bad value gets: the flag, what was expected and what was given.
#pragma once

#include <charconv>
#include <set>
#include <string>
#include <vector>

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

// The arguments with "--flag=value" read as "--flag value", as Go's flag package (and so
// kubectl) reads it: manifests and the Helm chart write it that way. A switch (one of
// `switches`) takes =true (on) or =false (off); any other value stays attached, and the parser
// calls it an unknown flag. argv[0] is kept as it is.
inline std::vector<std::string> SplitFlagValues(int argc, char** argv,
                                                const std::set<std::string>& switches) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (i == 0 || a.rfind("--", 0) != 0 || eq == std::string::npos) {
      args.push_back(a);
      continue;
    }
    const std::string name = a.substr(0, eq), value = a.substr(eq + 1);
    if (!switches.count(name)) {
      args.push_back(name);
      args.push_back(value);
    } else if (value == "true") {
      args.push_back(name);
    } else if (value != "false") {
      args.push_back(a);
    }
  }
  return args;
}

}  // namespace tidal
