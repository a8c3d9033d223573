// common/environment.h — the process environment as a map, for code that takes its settings
// from env vars but is handed them (so tests can pass their own).
#pragma once

#include <map>
#include <string>

extern char** environ;

namespace tidal {

inline std::map<std::string, std::string> EnvironmentMap() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace tidal
