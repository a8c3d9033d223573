// worker/checkpoint/merge_export.cc
#include "worker/checkpoint/merge_export.h"

#include <map>
#include <memory>

#include <torch/torch.h>

#include "api/train_config.h"
#include "worker/checkpoint/peft_export.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/model.h"
#include "worker/engine/model_config.h"
#include "worker/engine/safetensors.h"

namespace tidal::checkpoint {
namespace {

StatusOr<torch::ScalarType> OutputDtype(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kFloat16;
  return InvalidArgument("--dtype: expected fp32, bf16 or fp16, got \"" + name + "\"");
}

StatusOr<torch::Tensor> ToTensor(const NamedTensor& t) {
  TIDAL_ASSIGN_OR_RETURN(torch::ScalarType type, engine::ScalarTypeFromSafetensors(t.dtype));
  return torch::from_blob(const_cast<char*>(t.bytes.data()), t.shape,
                          torch::TensorOptions().dtype(type))
      .clone();
}

}  // namespace

StatusOr<MergeReport> ExportMerged(Repository& repo, std::optional<int64_t> step,
                                   const std::string& out_dir, const MergeOptions& options) {
  Manifest manifest;
  if (step) {
    TIDAL_ASSIGN_OR_RETURN(manifest, repo.ReadManifest(*step));
  } else {
    TIDAL_ASSIGN_OR_RETURN(manifest, repo.NewestUsable());
  }
  TIDAL_ASSIGN_OR_RETURN(nlohmann::json state, repo.ReadTrainerState(manifest.step));
  TIDAL_ASSIGN_OR_RETURN(AdapterInfo info, AdapterInfoFromTrainerState(state));
  TIDAL_ASSIGN_OR_RETURN(std::vector<NamedTensor> adapter,
                         ReadAdapterTensors(repo, manifest, info));
  std::map<std::string, const NamedTensor*> adapter_by_name;
  for (const NamedTensor& t : adapter) adapter_by_name[t.name] = &t;

  // The base model: its directory, or the preset regenerated from its seed.
  engine::ModelConfig config;
  std::unique_ptr<engine::HfCheckpoint> hf;
  const std::string base_uri = options.base_uri.value_or(info.base_uri);
  if (!base_uri.empty()) {
    TIDAL_ASSIGN_OR_RETURN(std::string dir, engine::LocalPathFromUri(base_uri, "", "base model"));
    TIDAL_ASSIGN_OR_RETURN(hf, engine::HfCheckpoint::Open(dir));
    config = hf->config();
  } else {
    TIDAL_ASSIGN_OR_RETURN(config, engine::PresetModelConfig(info.base_preset));
  }
  engine::LoraSpec lora;
  lora.rank = info.rank;
  lora.alpha = info.alpha;
  lora.dropout = info.dropout;
  lora.target_modules = info.target_modules;
  // The adapter's targets against this base (gate without up on a model with experts, a rank
  // above a projection's side, a module it lacks): refused here, not merged into nothing.
  TIDAL_RETURN_IF_ERROR(engine::CheckLoraFitsModel(lora, config));
  engine::DecoderModel model(config, lora);
  engine::ParameterReader read = hf ? hf->Reader(model, info.base_init_seed)
                                    : engine::RandomInitReader(model, info.base_init_seed);

  torch::ScalarType dtype = torch::kFloat32;
  if (!options.dtype.empty()) {
    TIDAL_ASSIGN_OR_RETURN(dtype, OutputDtype(options.dtype));
  } else if (hf) {
    dtype = hf->StoredDtype(model.blocks().front().params.front().name).value_or(torch::kFloat32);
  }

  MergeReport report;
  report.step = manifest.step;
  std::vector<std::pair<std::string, torch::Tensor>> merged;
  size_t adapters_used = 0;
  for (const engine::BlockSpec& block : model.blocks()) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const engine::ParamSpec& p : block.params) {
      if (p.trainable) {
        auto it = adapter_by_name.find(p.name);
        if (it == adapter_by_name.end())
          return FailedPrecondition(StepDirectory(manifest.step) + ": the checkpoint has no \"" +
                                    p.name + "\", which the base model's shape calls for");
        if (it->second->shape != p.shape)
          return FailedPrecondition(StepDirectory(manifest.step) + ": \"" + p.name +
                                    "\" does not fit the base model's shapes");
        TIDAL_ASSIGN_OR_RETURN(torch::Tensor t, ToTensor(*it->second));
        named.emplace_back(p.name, std::move(t));
        ++adapters_used;
      } else {
        TIDAL_ASSIGN_OR_RETURN(torch::Tensor t, read(p, 0, p.numel()));
        named.emplace_back(p.name, t.reshape(p.shape).to(torch::kFloat32));
      }
    }
    std::vector<std::string> adapted;
    TIDAL_ASSIGN_OR_RETURN(auto block_merged,
                           engine::MergeLora(named, lora, config.moe.n_routed_experts, &adapted));
    for (auto& [name, tensor] : block_merged) {
      report.bytes += static_cast<uint64_t>(tensor.numel()) * torch::elementSize(dtype);
      merged.emplace_back(name, tensor.to(dtype));
    }
    report.merged += static_cast<int64_t>(adapted.size());
  }
  if (adapters_used != adapter.size())
    return FailedPrecondition(StepDirectory(manifest.step) + ": " +
                              std::to_string(adapter.size() - adapters_used) +
                              " adapter weights match no module of the base model");
  report.tensors = static_cast<int64_t>(merged.size());
  TIDAL_ASSIGN_OR_RETURN(report.dtype, engine::SafetensorsDtypeName(dtype));
  TIDAL_RETURN_IF_ERROR(engine::WriteHfDirectory(out_dir, config, merged, options.max_shard_bytes));
  return report;
}

}  // namespace tidal::checkpoint
