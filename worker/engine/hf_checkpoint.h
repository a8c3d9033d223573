// worker/engine/hf_checkpoint.h — Hugging Face model directories: config.json plus one
// model.safetensors or several shards listed in model.safetensors.index.json.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "worker/engine/model.h"
#include "worker/engine/model_files.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/zero.h"

namespace tidal::engine {

class HfCheckpoint {
 public:
  // Opens `dir`: parses config.json and maps every shard. Errors name the file.
  static StatusOr<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir);
  // Opens the directory `files` reads (a local one, or an object store prefix): config.json,
  // tidal.checksums.json when there is one, and each shard's header. Tensors are then read by
  // range as the Reader asks for them — a ZeRO-3 rank fetches only its own slices — and, with
  // checksums, verified block by block.
  static StatusOr<std::unique_ptr<HfCheckpoint>> Open(std::unique_ptr<ModelFiles> files);

  const ModelConfig& config() const { return config_; }
  // Reads base weights from the shards; parameters not in the checkpoint that are LoRA
  // adapters get `model.InitialValue(spec, seed)`; a missing or mis-shaped base weight is an
  // error naming it. FP8 weights (DeepSeek-V3) are dequantized with their weight_scale_inv.
  ParameterReader Reader(const DecoderModel& model, uint64_t adapter_seed) const;
  // The dtype `name` is stored in, or nullopt when the checkpoint lacks it.
  std::optional<torch::ScalarType> StoredDtype(const std::string& name) const;
  // Bytes fetched from the source so far (0 for a mapped local directory).
  uint64_t BytesRead() const;
  bool verified() const { return checksums_.has_value(); }

 private:
  StatusOr<torch::Tensor> DequantizedRange(const ParamSpec& spec, const SafetensorsEntry& entry,
                                           const SafetensorsFile& file, int64_t first,
                                           int64_t count) const;
  std::unique_ptr<ModelFiles> source_;
  std::optional<ModelChecksums> checksums_;
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> by_name_;
};

// Writes `named` as an HF directory: config.json, shards of at most `max_shard_bytes` and,
// when there is more than one shard, model.safetensors.index.json.
Status WriteHfDirectory(const std::string& dir, const ModelConfig& config,
                        const std::vector<std::pair<std::string, torch::Tensor>>& named,
                        int64_t max_shard_bytes);

// Initial values for a random-initialised model.
ParameterReader RandomInitReader(const DecoderModel& model, uint64_t seed);

}  // namespace tidal::engine
