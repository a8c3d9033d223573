// worker/engine/hf_checkpoint.cc
#include "worker/engine/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace tidal::engine {

namespace fs = std::filesystem;

StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir) {
  return Open(LocalModelFiles(dir));
}

StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(std::unique_ptr<ModelFiles> files) {
  std::unique_ptr<HfCheckpoint> ckpt(new HfCheckpoint());
  ModelFiles& source = *files;
  ckpt->source_ = std::move(files);
  ckpt->dir_ = source.Describe("");
  if (!ckpt->dir_.empty() && ckpt->dir_.back() == '/') ckpt->dir_.pop_back();
  const std::string& dir = ckpt->dir_;
  auto config_text = source.Read("config.json");
  if (!config_text.ok()) {
    if (config_text.status().code() == StatusCode::kNotFound)
      return NotFound("spec.model.uri: " + source.Describe("config.json") + " not found");
    return config_text.status();
  }
  nlohmann::json config_json = nlohmann::json::parse(*config_text, nullptr, false);
  if (config_json.is_discarded())
    return InvalidArgument(source.Describe("config.json") + ": not valid JSON");
  auto config = ModelConfigFromHfJson(config_json);
  if (!config.ok()) return config.status().WithContext(dir);
  ckpt->config_ = *config;

  // Block checksums, when the directory has them: every read is then verified.
  auto sums = source.Read(ModelChecksums::kFileName);
  if (sums.ok()) {
    TIDAL_ASSIGN_OR_RETURN(
        auto parsed, ModelChecksums::FromJson(*sums, source.Describe(ModelChecksums::kFileName)));
    ckpt->checksums_ = std::move(parsed);
  } else if (sums.status().code() != StatusCode::kNotFound) {
    return sums.status();
  }
  TIDAL_ASSIGN_OR_RETURN(auto shard_names, WeightFiles(source));
  const auto local = source.LocalDirectory();
  for (const auto& name : shard_names) {
    const ModelChecksums::File* sum = nullptr;
    if (ckpt->checksums_) {
      auto it = ckpt->checksums_->files.find(name);
      if (it == ckpt->checksums_->files.end())
        return DataLoss(source.Describe(ModelChecksums::kFileName) + " has no entry for " + name);
      sum = &it->second;
    }
    // A local directory without checksums is mapped; otherwise files are read by range.
    auto file = local && !sum
                    ? SafetensorsFile::Open(*local + "/" + name)
                    : SafetensorsFile::Open(source, name, sum,
                                            ckpt->checksums_ ? ckpt->checksums_->block_bytes : 0);
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

uint64_t HfCheckpoint::BytesRead() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->bytes_read();
  return total;
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
    // As stored (the loader converts once, into the compute dtype); FP8 dequantized in fp32.
    if (entry.dtype != torch::kFloat8_e4m3fn && entry.dtype != torch::kFloat8_e5m2)
      return it->second->ReadFlatRange(spec.name, first, count, entry.dtype);
    return DequantizedRange(spec, entry, *it->second, first, count);
  };
}

// An FP8 weight [rows, cols] and its weight_scale_inv [⌈rows/br⌉, ⌈cols/bc⌉]: element (i, j)
// is its FP8 value times the scale of block (i / br, j / bc) — DeepSeek-V3's layout.
StatusOr<torch::Tensor> HfCheckpoint::DequantizedRange(const ParamSpec& spec,
                                                       const SafetensorsEntry& entry,
                                                       const SafetensorsFile& file, int64_t first,
                                                       int64_t count) const {
  const int64_t br = config_.fp8_block_rows, bc = config_.fp8_block_cols;
  if (br == 0)
    return InvalidArgument(dir_ + ": tensor \"" + spec.name +
                           "\" is stored in FP8 but config.json has no quantization_config");
  const std::string suffix = ".weight";
  const std::string scale_name =
      spec.name.size() > suffix.size() &&
              spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) == 0
          ? spec.name + "_scale_inv"
          : "";
  auto scale_file = by_name_.find(scale_name);
  if (entry.shape.size() != 2 || scale_file == by_name_.end())
    return InvalidArgument(dir_ + ": FP8 tensor \"" + spec.name +
                           "\" needs a 2-D weight and its \"" + spec.name + "_scale_inv\"");
  const int64_t rows = entry.shape[0], cols = entry.shape[1];
  TIDAL_ASSIGN_OR_RETURN(torch::Tensor scales,
                         scale_file->second->Read(scale_name, torch::kFloat32));
  const std::vector<int64_t> grid = {(rows + br - 1) / br, (cols + bc - 1) / bc};
  if (scales.sizes().vec() != grid) {
    std::ostringstream msg;
    msg << dir_ << ": \"" << scale_name << "\" has shape " << scales.sizes() << ", blocks of " << br
        << " × " << bc << " over " << rows << " × " << cols << " need " << torch::IntArrayRef(grid);
    return InvalidArgument(msg.str());
  }
  TIDAL_ASSIGN_OR_RETURN(torch::Tensor values,
                         file.ReadFlatRange(spec.name, first, count, torch::kFloat32));
  auto index = torch::arange(first, first + count, torch::kInt64);
  auto block =
      index.div(cols, "floor").div(br, "floor") * grid[1] + index.remainder(cols).div(bc, "floor");
  return values * scales.reshape({-1}).index_select(0, block);
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
