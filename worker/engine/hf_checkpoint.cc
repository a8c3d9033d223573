// worker/engine/hf_checkpoint.cc
#include "worker/engine/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace tidal::engine {

namespace fs = std::filesystem;

StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir) {
  std::unique_ptr<HfCheckpoint> ckpt(new HfCheckpoint());
  ckpt->dir_ = dir;
  const fs::path root(dir);
  std::ifstream config_in(root / "config.json");
  if (!config_in)
    return NotFound("spec.model.uri: " + (root / "config.json").string() + " not found");
  nlohmann::json config_json;
  try {
    config_json = nlohmann::json::parse(config_in);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument((root / "config.json").string() + ": not valid JSON: " + e.what());
  }
  auto config = ModelConfigFromHfJson(config_json);
  if (!config.ok()) return config.status().WithContext(dir);
  ckpt->config_ = *config;

  std::vector<std::string> shard_names;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json index_json;
    try {
      std::ifstream in(index);
      index_json = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(index.string() + ": not valid JSON: " + e.what());
    }
    if (!index_json.contains("weight_map") || !index_json["weight_map"].is_object())
      return InvalidArgument(index.string() + ": missing object \"weight_map\"");
    std::set<std::string> unique;
    for (const auto& [name, file] : index_json["weight_map"].items()) {
      if (!file.is_string())
        return InvalidArgument(index.string() + ": weight_map." + name + " must be a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos)
        return InvalidArgument(index.string() + ": shard \"" + f + "\" must be a plain file name");
      if (unique.insert(f).second) shard_names.push_back(f);
    }
  } else if (fs::exists(root / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return NotFound("spec.model.uri: " + dir +
                    " has neither model.safetensors nor model.safetensors.index.json");
  }
  for (const auto& name : shard_names) {
    auto file = SafetensorsFile::Open((root / name).string());
    if (!file.ok()) return file.status();
    for (const auto& [tensor, entry] : (*file)->entries()) {
      if (ckpt->by_name_.count(tensor))
        return InvalidArgument(dir + ": tensor " + tensor + " appears in more than one shard");
      ckpt->by_name_[tensor] = file->get();
    }
    ckpt->files_.push_back(std::move(*file));
  }
  return ckpt;
}

ParameterReader HfCheckpoint::Reader(const DecoderModel& model, uint64_t adapter_seed) const {
  return [this, &model, adapter_seed](const ParamSpec& spec, int64_t first,
                                      int64_t count) -> StatusOr<torch::Tensor> {
    auto it = by_name_.find(spec.name);
    if (it == by_name_.end()) {
      if (spec.trainable)
        return model.InitialValue(spec, adapter_seed).reshape({-1}).narrow(0, first, count);
      return NotFound(dir_ + ": checkpoint has no tensor \"" + spec.name + "\"");
    }
    const auto& entry = it->second->entries().at(spec.name);
    if (entry.shape != spec.shape) {
      std::ostringstream msg;
      msg << dir_ << ": tensor \"" << spec.name << "\" has shape "
          << torch::IntArrayRef(entry.shape) << ", the model expects "
          << torch::IntArrayRef(spec.shape);
      return InvalidArgument(msg.str());
    }
    return it->second->ReadFlatRange(spec.name, first, count, torch::kFloat32);
  };
}

std::optional<torch::ScalarType> HfCheckpoint::StoredDtype(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second->entries().at(name).dtype;
}

Status WriteHfDirectory(const std::string& dir, const ModelConfig& config,
                        const std::vector<std::pair<std::string, torch::Tensor>>& named,
                        int64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create " + dir + ": " + ec.message());
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards(1);
  int64_t bytes = 0, total = 0;
  for (const auto& entry : named) {
    const int64_t size = entry.second.numel() * entry.second.element_size();
    if (bytes > 0 && bytes + size > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(entry);
    bytes += size;
    total += size;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    TIDAL_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file, shards[i], {{"format", "pt"}}));
    for (const auto& entry : shards[i]) weight_map[entry.first] = file;
  }
  if (shards.size() > 1) {
    std::ofstream index(dir + "/model.safetensors.index.json");
    index << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(
        2);
    if (!index) return Unavailable("cannot write " + dir + "/model.safetensors.index.json");
  }
  nlohmann::json hf = config.ToHfJson();
  if (!named.empty()) {  // as transformers records it: the dtype the weights are stored in
    const auto type = named.front().second.scalar_type();
    hf["torch_dtype"] = type == torch::kBFloat16  ? "bfloat16"
                        : type == torch::kFloat16 ? "float16"
                                                  : "float32";
  }
  std::ofstream out(dir + "/config.json");
  out << hf.dump(2);
  if (!out) return Unavailable("cannot write " + dir + "/config.json");
  return OkStatus();
}

ParameterReader RandomInitReader(const DecoderModel& model, uint64_t seed) {
  return [&model, seed](const ParamSpec& spec, int64_t first,
                        int64_t count) -> StatusOr<torch::Tensor> {
    return model.InitialValue(spec, seed).reshape({-1}).narrow(0, first, count);
  };
}

}  // namespace tidal::engine
