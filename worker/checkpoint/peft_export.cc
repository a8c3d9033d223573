// worker/checkpoint/peft_export.cc
#include "worker/checkpoint/peft_export.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "worker/engine/safetensors_header.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

constexpr char kOptimizerPrefix[] = "optimizer.";
constexpr char kLoraA[] = ".lora_A.weight";
constexpr char kLoraB[] = ".lora_B.weight";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "model.layers.0.self_attn.q_proj.lora_A.weight" → "q_proj" (the module PEFT targets by name).
std::string TargetModule(const std::string& name, size_t suffix_size) {
  std::string module = name.substr(0, name.size() - suffix_size);
  size_t dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

bool Targets(const AdapterInfo& info, const std::string& module) {
  return std::find(info.target_modules.begin(), info.target_modules.end(), module) !=
         info.target_modules.end();
}

// The routed experts' fused adapters: "<layer>.mlp.experts.<gate_up_proj|down_proj>.lora_*".
constexpr char kExperts[] = ".mlp.experts.";
bool IsExpertsAdapter(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return false;
  const std::string rest = name.substr(at + sizeof(kExperts) - 1);
  return rest.rfind("gate_up_proj.lora_", 0) == 0 || rest.rfind("down_proj.lora_", 0) == 0;
}

}  // namespace

json AdapterInfoJson(const AdapterInfo& info) {
  json base = json::object();
  if (!info.base_uri.empty()) base["uri"] = info.base_uri;
  if (!info.base_preset.empty()) base["preset"] = info.base_preset;
  base["initSeed"] = info.base_init_seed;
  return {{"r", info.rank},
          {"loraAlpha", info.alpha},
          {"loraDropout", info.dropout},
          {"targetModules", info.target_modules},
          {"routedExperts", info.routed_experts},
          {"baseModel", std::move(base)}};
}

StatusOr<AdapterInfo> AdapterInfoFromTrainerState(const json& state) {
  const std::string where = "trainer_state.json: adapter";
  auto it = state.is_object() ? state.find("adapter") : state.end();
  if (!state.is_object() || it == state.end() || !it->is_object())
    return InvalidArgument(where + ": missing (the checkpoint predates adapter export)");
  const json& a = *it;
  auto field = [&](const char* key) -> const json* {
    auto f = a.find(key);
    return f == a.end() ? nullptr : &*f;
  };
  AdapterInfo info;
  const json* r = field("r");
  if (!r || !r->is_number_integer() || r->get<int64_t>() <= 0)
    return InvalidArgument(where + ".r: expected a positive integer");
  info.rank = r->get<int64_t>();
  const json* alpha = field("loraAlpha");
  if (!alpha || !alpha->is_number() || !(alpha->get<double>() > 0))
    return InvalidArgument(where + ".loraAlpha: expected a positive number");
  info.alpha = alpha->get<double>();
  const json* dropout = field("loraDropout");
  if (!dropout || !dropout->is_number() || dropout->get<double>() < 0 ||
      dropout->get<double>() >= 1)
    return InvalidArgument(where + ".loraDropout: expected a number in [0, 1)");
  info.dropout = dropout->get<double>();
  const json* targets = field("targetModules");
  if (!targets || !targets->is_array() || targets->empty())
    return InvalidArgument(where + ".targetModules: expected a non-empty list of module names");
  for (const json& t : *targets) {
    if (!t.is_string() || t.get<std::string>().empty())
      return InvalidArgument(where + ".targetModules: expected non-empty strings");
    info.target_modules.push_back(t.get<std::string>());
  }
  if (const json* experts = field("routedExperts")) {  // absent before MoE adapters: dense
    if (!experts->is_number_integer() || experts->get<int64_t>() < 0)
      return InvalidArgument(where + ".routedExperts: expected a non-negative integer");
    info.routed_experts = experts->get<int64_t>();
  }
  const json* base = field("baseModel");
  if (!base || !base->is_object())
    return InvalidArgument(where + ".baseModel: expected an object with uri or preset");
  if (auto u = base->find("uri"); u != base->end() && u->is_string()) info.base_uri = *u;
  if (auto p = base->find("preset"); p != base->end() && p->is_string()) info.base_preset = *p;
  if (auto s = base->find("initSeed"); s != base->end()) {
    if (!s->is_number_unsigned())
      return InvalidArgument(where + ".baseModel.initSeed: expected a non-negative integer");
    info.base_init_seed = s->get<uint64_t>();
  }
  if (info.base_uri.empty() == info.base_preset.empty())
    return InvalidArgument(where + ".baseModel: expected exactly one of uri and preset");
  return info;
}

StatusOr<std::vector<NamedTensor>> ReadAdapterTensors(Repository& repo, const Manifest& manifest,
                                                      const AdapterInfo& info) {
  const std::string where =
      repo.store().uri() + "/" + StepDirectory(manifest.step) + "/manifest.json: ";
  std::vector<NamedTensor> out;
  // Per adapted module: the rank both halves agree on is checked below.
  std::map<std::string, int> halves;
  for (const TensorEntry& t : manifest.tensors) {
    if (t.name.rfind(kOptimizerPrefix, 0) == 0) continue;
    const bool a = EndsWith(t.name, kLoraA), b = EndsWith(t.name, kLoraB);
    if (!a && !b)
      return FailedPrecondition(where + t.name +
                                ": not a LoRA weight; PEFT export covers LoRA adapters only");
    const std::string module = TargetModule(t.name, a ? sizeof(kLoraA) - 1 : sizeof(kLoraB) - 1);
    // The routed experts' gate_up_proj adapter stands for gate_proj and up_proj, at rank 2r
    // per expert; their down_proj at r per expert.
    const bool experts = info.routed_experts > 0 && IsExpertsAdapter(t.name);
    const bool gate_up = experts && module == "gate_up_proj";
    const bool targeted =
        gate_up ? Targets(info, "gate_proj") && Targets(info, "up_proj") : Targets(info, module);
    if (!targeted)
      return FailedPrecondition(where + t.name + ": module \"" + module +
                                "\" is not among the adapter's target modules");
    const int64_t rank = info.rank * (gate_up ? 2 : 1) * (experts ? info.routed_experts : 1);
    const bool shaped = t.shape.size() == 2 && t.shape[a ? 0 : 1] == rank;
    if (!shaped)
      return FailedPrecondition(
          where + t.name + ": expected a 2-D " + (a ? "[r, in_features]" : "[out_features, r]") +
          " tensor with r = " + std::to_string(rank) +
          (experts ? " (rank " + std::to_string(info.rank) + (gate_up ? " × 2" : "") + " × " +
                         std::to_string(info.routed_experts) + " routed experts)"
                   : ""));
    halves[t.name.substr(0, t.name.size() - sizeof(kLoraA) + 1)] += a ? 1 : 2;
    TIDAL_ASSIGN_OR_RETURN(std::string bytes, repo.ReadTensor(manifest, t.name, 0, t.numel()));
    out.push_back({t.name, t.dtype, t.shape, std::move(bytes)});
  }
  for (const auto& [module, seen] : halves)
    if (seen != 3)
      return FailedPrecondition(where + module + ": has lora_" + (seen == 1 ? "A" : "B") +
                                " but not lora_" + (seen == 1 ? "B" : "A"));
  if (out.empty()) return FailedPrecondition(where + "holds no LoRA weights");
  return out;  // manifest tensors are sorted by name
}

std::string PeftTensorName(const std::string& name,
                           const std::vector<std::string>& target_modules) {
  const std::string prefix = "base_model.model.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos || !IsExpertsAdapter(name)) return prefix + name;
  const std::string experts = name.substr(0, at + sizeof(kExperts) - 1);  // "...mlp.experts."
  std::string rest = name.substr(experts.size());                         // "down_proj.lora_A…"
  const std::string parameter = rest.substr(0, rest.find('.'));
  rest = rest.substr(parameter.size() + 1);
  const bool down_wraps =
      std::find(target_modules.begin(), target_modules.end(), "down_proj") != target_modules.end();
  if (parameter == "gate_up_proj" && down_wraps) return prefix + experts + "base_layer." + rest;
  return prefix + experts + rest;
}

json PeftAdapterConfig(const AdapterInfo& info,
                       const std::optional<std::string>& base_model_name_or_path) {
  json base = nullptr;
  if (base_model_name_or_path)
    base = *base_model_name_or_path;
  else if (!info.base_uri.empty())
    base = info.base_uri;
  // lora_alpha is an int in PEFT's LoraConfig; keep a fractional one as it is.
  json alpha = info.alpha;
  if (std::floor(info.alpha) == info.alpha) alpha = static_cast<int64_t>(info.alpha);
  // With routed experts, gate/up/down_proj are PEFT's target_parameters on the experts' fused
  // parameters (what PEFT's own conversion of those names makes, so PEFT loads it as it is).
  json target_modules = json::array(), target_parameters = nullptr;
  json rank_pattern = json::object(), alpha_pattern = json::object();
  for (const std::string& m : info.target_modules) {
    const bool expert =
        info.routed_experts > 0 && (m == "gate_proj" || m == "up_proj" || m == "down_proj");
    if (!expert) target_modules.push_back(m);
  }
  if (info.routed_experts > 0) {
    if (Targets(info, "gate_proj") && Targets(info, "up_proj")) {
      target_parameters = json::array({"gate_up_proj"});
      rank_pattern[".*\\.gate_up_proj"] = 2 * info.rank;
      alpha_pattern[".*\\.gate_up_proj"] =
          alpha.is_number_integer() ? json(2 * alpha.get<int64_t>()) : json(2 * info.alpha);
    }
    if (Targets(info, "down_proj")) {
      if (target_parameters.is_null()) target_parameters = json::array();
      target_parameters.push_back("down_proj");
    }
  }
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base},
          {"revision", nullptr},
          {"inference_mode", true},
          {"r", info.rank},
          {"lora_alpha", alpha},
          {"lora_dropout", info.dropout},
          {"target_modules", target_modules.empty() ? json(nullptr) : target_modules},
          {"target_parameters", target_parameters},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", false},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", rank_pattern},
          {"alpha_pattern", alpha_pattern}};
}

StatusOr<std::string> PeftAdapterWeights(const std::vector<NamedTensor>& tensors,
                                         const AdapterInfo& info, int64_t step) {
  std::vector<safetensors::TensorHeader> headers;
  uint64_t data = 0;
  for (const NamedTensor& t : tensors) {
    headers.push_back(
        {PeftTensorName(t.name, info.target_modules), t.dtype, t.shape, t.bytes.size()});
    data += t.bytes.size();
  }
  TIDAL_ASSIGN_OR_RETURN(
      std::string file,
      safetensors::EncodeHeader(headers, {{"format", "pt"}, {"tidal.step", std::to_string(step)}}));
  file.reserve(file.size() + data);
  for (const NamedTensor& t : tensors) file += t.bytes;
  return file;
}

StatusOr<PeftExport> ExportPeftAdapter(Repository& repo, std::optional<int64_t> step,
                                       objstore::ObjectStore& out, const std::string& prefix,
                                       const std::optional<std::string>& base_model_name_or_path) {
  Manifest manifest;
  if (step) {
    TIDAL_ASSIGN_OR_RETURN(manifest, repo.ReadManifest(*step));
  } else {
    TIDAL_ASSIGN_OR_RETURN(manifest, repo.NewestUsable());
  }
  TIDAL_ASSIGN_OR_RETURN(json state, repo.ReadTrainerState(manifest.step));
  TIDAL_ASSIGN_OR_RETURN(AdapterInfo info, AdapterInfoFromTrainerState(state));
  TIDAL_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                         ReadAdapterTensors(repo, manifest, info));
  TIDAL_ASSIGN_OR_RETURN(std::string weights, PeftAdapterWeights(tensors, info, manifest.step));
  // Weights first: a reader that finds the config finds the weights it describes.
  TIDAL_RETURN_IF_ERROR(out.Put(prefix + kAdapterWeightsFile, weights));
  TIDAL_RETURN_IF_ERROR(out.Put(prefix + kAdapterConfigFile,
                                PeftAdapterConfig(info, base_model_name_or_path).dump(2) + "\n"));
  return PeftExport{manifest.step, tensors.size(), weights.size()};
}

}  // namespace tidal::checkpoint
