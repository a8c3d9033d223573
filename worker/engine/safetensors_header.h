// worker/engine/safetensors_header.h — the front of a safetensors file, without LibTorch: an 8-byte
// little-endian header length, then a JSON header naming each tensor's dtype, shape and byte
// range in the data section, padded with spaces so the data starts 8-byte aligned (as the
// reference writer does). The engine's writer (tensors), the checkpoint shards and the PEFT
// export (raw bytes) all lay out their files with this, and every reader parses the header
// with ParseHeader: a file's bytes come from users and object stores, so the parser is fuzzed
// (fuzz/safetensors_header_fuzz.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::safetensors {

struct TensorHeader {
  std::string name;
  std::string dtype;  // F32, BF16, F16, I64, ...
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // size of its data; tensors follow each other in the data section
};

// The header for `tensors` laid out back to back in the given order (their data follows the
// returned bytes directly). A repeated or reserved name is refused.
inline StatusOr<std::string> EncodeHeader(const std::vector<TensorHeader>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorHeader& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name))
      return InvalidArgument("safetensors: tensor name \"" + t.name +
                             "\": expected a unique, non-empty name");
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  return out + text;
}

// The format caps the header at 100 MB (safetensors' own limit), which also bounds what a
// garbled length field can make a reader allocate.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The bytes of one element of each dtype the project reads and writes; nullopt for another.
inline std::optional<uint64_t> DtypeBytes(std::string_view dtype) {
  static constexpr std::pair<std::string_view, uint64_t> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kSizes)
    if (name == dtype) return bytes;
  return std::nullopt;
}

// The header's length from a file's first 8 bytes (`prefix`), checked against the file's
// size: DataLoss naming `where` for a truncated file or one that is not safetensors.
inline StatusOr<uint64_t> HeaderLength(std::string_view prefix, uint64_t file_size,
                                       const std::string& where) {
  if (file_size < 8 || prefix.size() < 8)
    return DataLoss(where + ": file is " + std::to_string(file_size) +
                    " bytes, too short for a safetensors header");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(prefix[i]);
  if (length > kMaxHeaderBytes || length > file_size - 8)
    return DataLoss(where + ": header length " + std::to_string(length) +
                    " exceeds the file size (truncated or not a safetensors file)");
  return length;
}

struct HeaderEntry {
  std::string dtype;  // one DtypeBytes knows
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section; end - begin = numel × size
};

struct ParsedHeader {
  std::map<std::string, HeaderEntry> tensors;
  nlohmann::json metadata;  // "__metadata__", when present
};

// Validates a header whose data section is `data_size` bytes: a JSON object of entries, each
// with a known dtype, non-negative dims, and data_offsets inside the data section holding
// exactly numel × element size bytes (computed without overflow: a crafted shape such as
// [2^61 + 1] would otherwise wrap to a small size that passes the bounds check); no two tensors
// overlap. Anything else is DataLoss naming `where` and the tensor, never a crash.
inline StatusOr<ParsedHeader> ParseHeader(std::string_view header_bytes, uint64_t data_size,
                                          const std::string& where) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_bytes.begin(), header_bytes.end());
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(where + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLoss(where + ": header must be a JSON object");
  ParsedHeader parsed;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      parsed.metadata = info;
      continue;
    }
    const std::string tensor = where + ": tensor \"" + name + "\"";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      return DataLoss(tensor + ": entry needs dtype, shape and data_offsets [begin, end]");
    HeaderEntry entry;
    entry.dtype = info["dtype"].get<std::string>();
    const std::optional<uint64_t> element = DtypeBytes(entry.dtype);
    if (!element)
      return DataLoss(tensor + ": unsupported safetensors dtype \"" + entry.dtype + "\"");
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return DataLoss(tensor + ": shape must be non-negative integers");
      entry.shape.push_back(d.get<int64_t>());
    }
    uint64_t expected = *element;
    for (int64_t d : entry.shape)
      if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected) ||
          expected > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return DataLoss(tensor + ": shape is too large");
    for (const auto& o : info["data_offsets"])
      if (!o.is_number_unsigned()) return DataLoss(tensor + ": data_offsets must be unsigned");
    entry.begin = info["data_offsets"][0].get<uint64_t>();
    entry.end = info["data_offsets"][1].get<uint64_t>();
    if (entry.end < entry.begin || entry.end > data_size || entry.end - entry.begin != expected)
      return DataLoss(tensor + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                      std::to_string(entry.end) + ") do not hold " + std::to_string(expected) +
                      " bytes inside the " + std::to_string(data_size) + "-byte data section");
    ranges.emplace_back(entry.begin, entry.end);
    parsed.tensors.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return DataLoss(where + ": tensors overlap in the data section");
  return parsed;
}

}  // namespace tidal::safetensors
