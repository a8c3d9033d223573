// worker/engine/model_files.h — where a Hugging Face model directory's files are read from: a
// local directory, or (worker/data/provider.cc) an object store prefix, file:// or s3://, read
// by byte range so that a ZeRO-3 rank fetches only the ranges of its own shards. And the
// directory's block checksums (tidal.checksums.json, written by `tidal-prep --checksum-model`),
// against which every range read is verified. No LibTorch here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tidal::engine {

class ModelFiles {
 public:
  virtual ~ModelFiles() = default;
  // The file's full name for messages: /models/x/config.json, s3://bucket/models/x/config.json.
  virtual std::string Describe(const std::string& name) const = 0;
  // The whole file; NotFound when there is none.
  virtual StatusOr<std::string> Read(const std::string& name) = 0;
  virtual StatusOr<uint64_t> Size(const std::string& name) = 0;
  // Exactly `length` bytes at `offset` into `dest`; a short file is DataLoss.
  virtual Status ReadRange(const std::string& name, uint64_t offset, uint64_t length,
                           char* dest) = 0;
  // The directory's path when its files are local (they are mapped rather than read).
  virtual std::optional<std::string> LocalDirectory() const { return std::nullopt; }
};

std::unique_ptr<ModelFiles> LocalModelFiles(const std::string& dir);

// tidal.checksums.json: per file, its size and the XXH3-64 of each block of block_bytes (the
// last one shorter).
struct ModelChecksums {
  static constexpr const char* kFileName = "tidal.checksums.json";
  static constexpr uint64_t kDefaultBlockBytes = 1 << 20;
  struct File {
    uint64_t size = 0;
    std::vector<uint64_t> blocks;
  };
  uint64_t block_bytes = kDefaultBlockBytes;
  std::map<std::string, File> files;

  std::string ToJson() const;
  // Every field checked; errors name `where` and the field.
  static StatusOr<ModelChecksums> FromJson(std::string_view text, const std::string& where);
};

uint64_t BlockHash(std::string_view bytes);

// The safetensors files of an HF directory: those model.safetensors.index.json lists, else
// model.safetensors. Errors name the file.
StatusOr<std::vector<std::string>> WeightFiles(ModelFiles& files);

// Reads every weight file once, block by block, for tidal.checksums.json; `progress` gets
// (bytes done, bytes in all).
StatusOr<ModelChecksums> ComputeModelChecksums(
    ModelFiles& files, uint64_t block_bytes = ModelChecksums::kDefaultBlockBytes,
    const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace tidal::engine
