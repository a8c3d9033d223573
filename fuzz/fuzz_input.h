// fuzz/fuzz_input.h — what the fuzz targets share: an input split into fields on NUL bytes
// (a seed is "field\0field\0..."; the fuzzer finds the separators by itself), and a finding
// that is not a crash (a broken invariant) turned into one, so libFuzzer keeps the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace tidal::fuzz {

// The first `n` NUL-separated fields of the input; missing ones are empty, and the last one
// keeps any further NULs.
inline std::vector<std::string> Fields(const uint8_t* data, size_t size, size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> fields;
  while (fields.size() + 1 < n) {
    size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    fields.emplace_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  fields.emplace_back(rest);
  fields.resize(n);
  return fields;
}

inline std::string_view Text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A broken invariant: says which, and aborts so that the fuzzer saves the input.
[[noreturn]] inline void Violated(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: invariant violated: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace tidal::fuzz
