// worker/engine/model_files.cc
#include "worker/engine/model_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tidal::engine {
namespace {

class LocalFiles : public ModelFiles {
 public:
  explicit LocalFiles(std::string dir) : dir_(std::move(dir)) {}
  std::string Describe(const std::string& name) const override { return dir_ + "/" + name; }
  StatusOr<std::string> Read(const std::string& name) override {
    std::ifstream in(Describe(name), std::ios::binary);
    if (!in) return NotFound(Describe(name) + " not found");
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
  StatusOr<uint64_t> Size(const std::string& name) override {
    struct stat st {};
    if (::stat(Describe(name).c_str(), &st) != 0)
      return NotFound(Describe(name) + ": " + std::strerror(errno));
    return static_cast<uint64_t>(st.st_size);
  }
  Status ReadRange(const std::string& name, uint64_t offset, uint64_t length, char* dest) override {
    const std::string path = Describe(name);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
    uint64_t done = 0;
    while (done < length) {
      const ssize_t n = ::pread(fd, dest + done, length - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        return n == 0 ? DataLoss(path + ": ends before byte " + std::to_string(offset + length))
                      : Unavailable(path + ": read failed: " + std::strerror(errno));
      }
      done += static_cast<uint64_t>(n);
    }
    ::close(fd);
    return OkStatus();
  }
  std::optional<std::string> LocalDirectory() const override { return dir_; }

 private:
  std::string dir_;
};

std::string Hex(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

}  // namespace

std::unique_ptr<ModelFiles> LocalModelFiles(const std::string& dir) {
  return std::make_unique<LocalFiles>(dir);
}

uint64_t BlockHash(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string ModelChecksums::ToJson() const {
  nlohmann::json list = nlohmann::json::object();
  for (const auto& [name, file] : files) {
    nlohmann::json blocks = nlohmann::json::array();
    for (uint64_t h : file.blocks) blocks.push_back(Hex(h));
    list[name] = {{"size", file.size}, {"xxh3", blocks}};
  }
  return nlohmann::json{
      {"format", "tidal-model-checksums/v1"}, {"blockBytes", block_bytes}, {"files", list}}
      .dump(1);
}

StatusOr<ModelChecksums> ModelChecksums::FromJson(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(where + ": not a JSON object");
  if (j.value("format", "") != "tidal-model-checksums/v1")
    return DataLoss(where + ": format must be \"tidal-model-checksums/v1\"");
  ModelChecksums out;
  if (!j.contains("blockBytes") || !j["blockBytes"].is_number_unsigned() ||
      j["blockBytes"].get<uint64_t>() == 0)
    return DataLoss(where + ": blockBytes must be a positive integer");
  out.block_bytes = j["blockBytes"].get<uint64_t>();
  if (!j.contains("files") || !j["files"].is_object())
    return DataLoss(where + ": files must be an object");
  for (const auto& [name, f] : j["files"].items()) {
    const std::string field = where + ": files." + name;
    if (!f.is_object() || !f.contains("size") || !f["size"].is_number_unsigned() ||
        !f.contains("xxh3") || !f["xxh3"].is_array())
      return DataLoss(field + ": needs size and xxh3 [block hashes]");
    File file;
    file.size = f["size"].get<uint64_t>();
    const uint64_t expected = (file.size + out.block_bytes - 1) / out.block_bytes;
    if (f["xxh3"].size() != expected)
      return DataLoss(field + ".xxh3: " + std::to_string(f["xxh3"].size()) + " hashes, a file of " +
                      std::to_string(file.size) + " bytes has " + std::to_string(expected) +
                      " blocks");
    for (const auto& h : f["xxh3"]) {
      if (!h.is_string() || h.get<std::string>().size() != 16)
        return DataLoss(field + ".xxh3: hashes are 16 hex digits");
      char* end = nullptr;
      const std::string s = h.get<std::string>();
      const unsigned long long v = std::strtoull(s.c_str(), &end, 16);
      if (end != s.c_str() + s.size()) return DataLoss(field + ".xxh3: \"" + s + "\" is not hex");
      file.blocks.push_back(v);
    }
    out.files.emplace(name, std::move(file));
  }
  return out;
}

StatusOr<std::vector<std::string>> WeightFiles(ModelFiles& files) {
  const std::string index_name = "model.safetensors.index.json";
  auto index = files.Read(index_name);
  if (!index.ok() && index.status().code() != StatusCode::kNotFound) return index.status();
  if (!index.ok()) {
    if (files.Size("model.safetensors").ok()) return std::vector<std::string>{"model.safetensors"};
    return NotFound("spec.model.uri: " + files.Describe("") +
                    " has neither model.safetensors nor model.safetensors.index.json");
  }
  const std::string where = files.Describe(index_name);
  nlohmann::json j = nlohmann::json::parse(*index, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return InvalidArgument(where + ": missing object \"weight_map\"");
  std::vector<std::string> names;
  std::set<std::string> unique;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      return InvalidArgument(where + ": weight_map." + tensor + " must be a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      return InvalidArgument(where + ": shard \"" + f + "\" must be a plain file name");
    if (unique.insert(f).second) names.push_back(f);
  }
  return names;
}

StatusOr<ModelChecksums> ComputeModelChecksums(
    ModelFiles& files, uint64_t block_bytes,
    const std::function<void(uint64_t, uint64_t)>& progress) {
  TIDAL_ASSIGN_OR_RETURN(auto names, WeightFiles(files));
  ModelChecksums out;
  out.block_bytes = block_bytes;
  uint64_t total = 0, done = 0;
  std::vector<uint64_t> sizes;
  for (const auto& name : names) {
    TIDAL_ASSIGN_OR_RETURN(uint64_t size, files.Size(name));
    sizes.push_back(size);
    total += size;
  }
  std::string block(block_bytes, '\0');
  for (size_t i = 0; i < names.size(); ++i) {
    ModelChecksums::File file;
    file.size = sizes[i];
    for (uint64_t offset = 0; offset < file.size; offset += block_bytes) {
      const uint64_t n = std::min(block_bytes, file.size - offset);
      TIDAL_RETURN_IF_ERROR(files.ReadRange(names[i], offset, n, block.data()));
      file.blocks.push_back(BlockHash(std::string_view(block.data(), n)));
      done += n;
      if (progress) progress(done, total);
    }
    out.files.emplace(names[i], std::move(file));
  }
  return out;
}

}  // namespace tidal::engine
