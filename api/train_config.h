// api/train_config.h — the parts of a TrainingJob `spec` (DESIGN.md §2) that the
// engine reads: model, dataset, lora, optimization. The same YAML is a tidal-train config and
// a TrainingJob spec; sections the engine does not own (elastic, checkpoint, ...) are accepted
// and ignored here. Plain data; no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::engine {

struct ModelSpec {
  std::string uri;     // HF-layout directory: /path, file:///path
  std::string preset;  // or a random-initialised preset: tiny | small | 1b | 7b
  uint64_t init_seed = 0;
};

struct DatasetSpec {
  // A JSONL object (tidal-prep tokenizes it first) or a token store tidal-prep wrote: a local
  // path (relative to the config file's folder), file:// or s3://.
  std::string uri;
  std::string format = "text";  // text | alpaca | messages
  int64_t max_seq_len = 2048;
  // "": the model's own tokenizer.json (model.uri), or bytes for a preset; "bytes": the byte
  // tokenizer, refused for a model that has a tokenizer of its own; or, for a preset only, a
  // directory (path, file://, s3://) holding tokenizer.json and tokenizer_config.json.
  std::string tokenizer;
  // Where a JSONL uri's store is written, at <preparedUri>/<content hash>; "": beside the JSONL,
  // in <its folder>/.tidal-tokens.
  std::string prepared_uri;
  std::string overlong = "truncate";  // a sample longer than maxSeqLen: truncate | drop
  bool packing = true;                // several samples per row, attention kept within each
  bool strict = false;                // a malformed record fails the run instead of being skipped
  // The loader: rows fetched ahead, the node-local cache directory ("" = none) and its bound,
  // and the share of this rank's first epoch fetched before step 0.
  int64_t lookahead = 64;
  std::string cache_dir;
  int64_t cache_max_mib = 8192;
  int64_t warmup_percent = 0;
};

struct LoraSpec {
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0.0;
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
};

struct WarmupSpec {
  int64_t steps = 0;
  bool adaptive = false;
  // Adaptive warmup: warmup progress is held while the coefficient of variation (stddev/mean)
  // of the gradient norm over the last `window` steps exceeds `cv_threshold`, for at most
  // `max_extra_steps` steps in total (defaults to `steps`).
  int64_t window = 10;
  double cv_threshold = 0.5;
  std::optional<int64_t> max_extra_steps;
};

// spec.optimization.gradientCompression (worker/engine/compression.h): off by default. topk: of
// each block's gradient only the ceil(ratio × elements) entries of largest magnitude are sent
// (values and indices), the rest kept as a residual added to the next step's (error feedback).
// The selection is made per compression group, a fixed share of the global batch's
// micro-batches (`groups` of them, each rank holding groups / world size), not per rank: the
// curve is then the same at every world size that divides `groups`, and a rescale keeps it.
// groups 0: the world size (the curve then changes when the world size does; the workers keep
// the spec they started with, so it is not derived from the editable spec.elastic).
struct GradientCompressionSpec {
  std::string method = "none";  // none | topk
  double ratio = 0.05;          // (0, 1]
  int64_t warmup_steps = 10;    // dense steps before compression starts
  int64_t groups = 0;
  bool enabled() const { return method == "topk"; }
  // The groups a generation of `world_size` ranks compresses in.
  int64_t GroupsAt(int world_size) const { return groups > 0 ? groups : world_size; }
};

struct OptimizationSpec {
  int zero_stage = 3;
  std::string offload_optimizer = "none";  // none | cpu
  std::string precision = "bf16";          // bf16 | fp16 | fp32
  int64_t global_batch_size = 8;
  int64_t micro_batch_size = 1;
  // microBatchSize: auto — micro_batch_size is then 1, the size whose loss and gradient the run
  // has, and the engine chooses the size it runs at (worker/engine/trainer.h): grown by steps
  // of ×1.2 while the step's peak memory stays under memory_target_percent of the device's,
  // shrunk after an out-of-memory.
  bool micro_batch_auto = false;
  double memory_target_percent = 80;
  double learning_rate = 2e-4;
  double min_lr_ratio = 0.1;  // cosine decays to learning_rate * min_lr_ratio
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double grad_clip = 1.0;  // max global L2 norm; 0 disables
  WarmupSpec warmup;
  GradientCompressionSpec gradient_compression;
  int64_t max_steps = 1000;
  uint64_t seed = 0;
};

struct TrainConfig {
  std::string name = "local";  // metadata.name when the file is a whole TrainingJob
  std::string namespace_;      // metadata.namespace, likewise
  ModelSpec model;
  DatasetSpec dataset;
  LoraSpec lora;
  OptimizationSpec optimization;

  // Checks that need the world size: gradient accumulation must be a whole number, and under
  // gradient compression the world size must divide its groups and they the micro-batches.
  Status ValidateForWorldSize(int world_size) const;
  int64_t GradientAccumulation(int world_size) const {  // after ValidateForWorldSize
    return optimization.global_batch_size / optimization.micro_batch_size / world_size;
  }
};

// Every spec.lora.targetModules name some supported family has (what the CRD's enum lists).
const std::set<std::string>& LoraTargetNames();

// Every spec.model.preset name (what the CRD's enum lists); the engine defines each
// (worker/engine/model_config.h, PresetModelConfig), and UnknownPreset is the refusal of any
// other name, naming the choices.
std::vector<std::string> PresetNames();
Status UnknownPreset(const std::string& name);

// Accepts either a bare spec or a whole TrainingJob manifest (its .spec is used). Every
// violation names the field path (e.g. "spec.lora.rank: must be > 0, got 0"). Relative
// dataset/model paths are resolved against `base_dir`.
StatusOr<TrainConfig> TrainConfigFromJson(const nlohmann::json& json, const std::string& base_dir);

// The engine's sections (model, dataset, lora, optimization) of a bare spec object read into
// `config`, every problem appended to `errors` with its field path. Top-level keys are not
// checked here: the caller knows which other sections its spec has.
void ReadEngineSections(const nlohmann::json& spec, const std::string& base_dir,
                        TrainConfig& config, std::vector<std::string>& errors);

// Resolves "file:///x" and plain paths to a local path; other schemes are refused with a
// message naming `field`.
StatusOr<std::string> LocalPathFromUri(const std::string& uri, const std::string& base_dir,
                                       const std::string& field);

}  // namespace tidal::engine
