// worker/engine/safetensors.h — the project's own reader/writer of the safetensors format
// (8-byte little-endian header length, JSON header, raw little-endian data). The reader maps
// the file and copies out only the element ranges asked for, so a ZeRO-3 rank reads its 1/W.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::engine {

struct SafetensorsEntry {
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: dtypes known, offsets inside the file, sizes equal to
  // numel × element size, no overlapping tensors. A truncated or garbled file is an error
  // naming the file and the tensor, never a crash.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // The whole tensor, converted to `dtype`.
  StatusOr<torch::Tensor> Read(const std::string& name, torch::ScalarType dtype) const;
  // Elements [first, first + count) of the row-major flattened tensor, converted to `dtype`.
  StatusOr<torch::Tensor> ReadFlatRange(const std::string& name, int64_t first, int64_t count,
                                        torch::ScalarType dtype) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  nlohmann::json metadata_;
};

// Writes tensors (any device; converted to CPU contiguous) in the given order. The file is
// written to `path.tmp` and renamed, so a reader never sees a torn file.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

StatusOr<torch::ScalarType> ScalarTypeFromSafetensors(const std::string& dtype);
StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype);

}  // namespace tidal::engine
