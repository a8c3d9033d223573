// worker/checkpoint/merge_export.h — `tidal-export --merge`: a checkpoint's LoRA adapters folded
// into the base weights (W + alpha/r · B·A, in fp32) and written as a plain Hugging Face model
// directory (config.json, model*.safetensors, an index when sharded) that transformers loads
// as LlamaForCausalLM without PEFT. The base weights come from the directory the job trained
// on (or the preset it was random-initialised from, regenerated from its seed), so they are
// never stored in checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "worker/checkpoint/repository.h"

namespace tidal::checkpoint {

struct MergeOptions {
  // An HF directory to take the base weights from instead of the one the checkpoint records
  // (the same model moved elsewhere).
  std::optional<std::string> base_uri;
  std::string dtype;  // fp32 | bf16 | fp16; "" keeps the base's (fp32 for a preset)
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default shard size
};

struct MergeReport {
  int64_t step = 0;
  int64_t tensors = 0;  // written
  int64_t merged = 0;   // base weights that had an adapter folded in
  uint64_t bytes = 0;
  std::string dtype;
};

// Checkpoint `step` (the newest usable one when unset) merged into `out_dir`. Holds the merged
// model in the output dtype plus one decoder layer in fp32.
StatusOr<MergeReport> ExportMerged(Repository& repo, std::optional<int64_t> step,
                                   const std::string& out_dir, const MergeOptions& options);

}  // namespace tidal::checkpoint
