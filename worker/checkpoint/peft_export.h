// worker/checkpoint/peft_export.h — a checkpoint's LoRA adapter as Hugging Face PEFT saves one
// (DESIGN.md §5 "final/"), without LibTorch:
//
//   adapter_model.safetensors  "base_model.model.<HF name>" → lora_A [r, in] / lora_B [out, r]
//                              (routed experts: [r · experts, in] / [out, r · experts])
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              target_modules, base_model_name_or_path, ...
//
// PEFT's save_pretrained strips the adapter name ("default") from the keys and prefixes them
// with its two wrappers (PeftModelForCausalLM → LoraModel), so `PeftModel.from_pretrained(base,
// dir)` maps them back. trainer_state.json records the adapter's shape and the base model, so
// a checkpoint exports without the config that trained it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/repository.h"
#include "worker/objstore/object_store.h"

namespace tidal::checkpoint {

inline constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";
inline constexpr char kAdapterConfigFile[] = "adapter_config.json";
inline constexpr char kFinalExportPrefix[] = "final/";

// The adapter and the base model it applies to, as trainer_state.json's "adapter" records it.
struct AdapterInfo {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  std::vector<std::string> target_modules;
  std::string base_uri;     // spec.model.uri: an HF directory
  std::string base_preset;  // or spec.model.preset, random-initialised from base_init_seed
  uint64_t base_init_seed = 0;
  // The base model's routed experts (0: dense). With experts, gate_proj/up_proj/down_proj name
  // the routed experts' fused parameters, as PEFT (0.21, transformers 5) targets them.
  int64_t routed_experts = 0;
};
nlohmann::json AdapterInfoJson(const AdapterInfo& info);
// From trainer_state.json (the whole object); errors name the field.
StatusOr<AdapterInfo> AdapterInfoFromTrainerState(const nlohmann::json& state);

// One whole tensor in little-endian bytes.
struct NamedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Every LoRA weight of the checkpoint (its optimizer state left out), whole and verified,
// sorted by name. Refuses tensors that are not LoRA weights of `info`'s target modules or whose
// shapes disagree with its rank, so an export never writes something PEFT would misread.
StatusOr<std::vector<NamedTensor>> ReadAdapterTensors(Repository& repo, const Manifest& manifest,
                                                      const AdapterInfo& info);

// "model.layers.0.self_attn.q_proj.lora_A.weight" → "base_model.model.model.layers.0...". The
// routed experts' adapters ("<layer>.mlp.experts.gate_up_proj.lora_A.weight", "...down_proj...")
// sit where PEFT's nested ParamWrappers put them: on the experts module itself for the outer
// one (down_proj when targeted), through "base_layer" for gate_up_proj wrapped inside it.
std::string PeftTensorName(const std::string& name, const std::vector<std::string>& target_modules);

// adapter_config.json; `base_model_name_or_path` defaults to info.base_uri (null for a preset).
// With routed experts, their targets are PEFT's target_parameters (gate_up_proj at rank and
// alpha doubled through rank_pattern / alpha_pattern, as PEFT converts them).
nlohmann::json PeftAdapterConfig(const AdapterInfo& info,
                                 const std::optional<std::string>& base_model_name_or_path = {});
// The bytes of adapter_model.safetensors.
StatusOr<std::string> PeftAdapterWeights(const std::vector<NamedTensor>& tensors,
                                         const AdapterInfo& info, int64_t step);

struct PeftExport {
  int64_t step = 0;
  size_t tensors = 0;
  uint64_t bytes = 0;  // of adapter_model.safetensors
};
// Exports checkpoint `step` (the newest usable one when unset) to `<prefix>adapter_model.
// safetensors` then `<prefix>adapter_config.json` in `out` (each written whole, durably).
StatusOr<PeftExport> ExportPeftAdapter(
    Repository& repo, std::optional<int64_t> step, objstore::ObjectStore& out,
    const std::string& prefix, const std::optional<std::string>& base_model_name_or_path = {});

}  // namespace tidal::checkpoint
