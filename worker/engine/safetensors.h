// worker/engine/safetensors.h — the project's own reader/writer of the safetensors format
// (8-byte little-endian header length, JSON header, raw little-endian data). The reader maps
// the file and copies out only the element ranges asked for, so a ZeRO-3 rank reads its 1/W.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/engine/model_files.h"

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
  // `name` of `files` (which must outlive the result), read by byte range as tensors are asked
  // for — never the whole file. With `checksums`, every byte read is verified first, whole
  // blocks at a time, and a mismatch is DataLoss naming the file, the byte range and the
  // tensor.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(ModelFiles& files, const std::string& name,
                                                         const ModelChecksums::File* checksums,
                                                         uint64_t block_bytes);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // Bytes fetched from the source so far (ranged files; checksummed blocks count whole).
  uint64_t bytes_read() const { return bytes_read_; }

  // The whole tensor, converted to `dtype`.
  StatusOr<torch::Tensor> Read(const std::string& name, torch::ScalarType dtype) const;
  // Elements [first, first + count) of the row-major flattened tensor, converted to `dtype`.
  StatusOr<torch::Tensor> ReadFlatRange(const std::string& name, int64_t first, int64_t count,
                                        torch::ScalarType dtype) const;

 private:
  SafetensorsFile() = default;
  Status ParseHeader(std::string_view header, uint64_t data_size);
  Status ReadBytes(uint64_t offset, uint64_t length, char* dest) const;
  std::string path_;
  // Ranged reads (files_ set) instead of a mapping.
  ModelFiles* files_ = nullptr;
  std::string name_;
  uint64_t data_offset_ = 0;
  const ModelChecksums::File* checksums_ = nullptr;
  uint64_t block_bytes_ = 0;
  mutable std::mutex cache_mu_;
  mutable uint64_t cached_block_ = UINT64_MAX;
  mutable std::string cached_bytes_;
  mutable std::atomic<uint64_t> bytes_read_{0};
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
