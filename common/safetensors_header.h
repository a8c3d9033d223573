// common/safetensors_header.h — the front of a safetensors file, without LibTorch: an 8-byte
// little-endian header length, then a JSON header naming each tensor's dtype, shape and byte
// range in the data section, padded with spaces so the data starts 8-byte aligned (as the
// reference writer does). The engine's writer (tensors), the checkpoint shards and the PEFT
// export (raw bytes) all lay out their files with this.
#pragma once

#include <cstdint>
#include <map>
#include <string>
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

}  // namespace tidal::safetensors
