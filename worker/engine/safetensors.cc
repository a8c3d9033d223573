// worker/engine/safetensors.cc
#include "worker/engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/safetensors_header.h"

namespace tidal::engine {

namespace {
// The format caps the header at 100 MB (safetensors' own limit), which also bounds what a
// garbled length field can make us allocate.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // Open() refused shapes whose product overflows
  return n;
}

namespace {
// The dtypes of the safetensors format the engine reads and writes.
constexpr std::pair<const char*, torch::ScalarType> kDtypes[] = {
    {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
    {"F64", torch::kFloat64}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
    {"I16", torch::kInt16},   {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool}};
}  // namespace

StatusOr<torch::ScalarType> ScalarTypeFromSafetensors(const std::string& dtype) {
  for (const auto& [name, type] : kDtypes)
    if (dtype == name) return type;
  return InvalidArgument("unsupported safetensors dtype \"" + dtype + "\"");
}

StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype) {
  for (const auto& [name, type] : kDtypes)
    if (dtype == type) return std::string(name);
  return InvalidArgument(std::string("dtype ") + c10::toString(dtype) +
                         " cannot be stored in safetensors");
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Internal(path + ": fstat failed");
  }
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return DataLoss(path + ": file is " + std::to_string(file->size_) +
                    " bytes, too short for a safetensors header");
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Internal(path + ": mmap failed: " + std::strerror(errno));
  file->map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file->size_ - 8)
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " exceeds the file size (truncated or not a safetensors file)");
  file->data_ = bytes + 8 + header_len;
  const uint64_t data_size = file->size_ - 8 - header_len;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLoss(path + ": header must be a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      file->metadata_ = info;
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      return DataLoss(where + ": entry needs dtype, shape and data_offsets [begin, end]");
    SafetensorsEntry entry;
    auto dtype = ScalarTypeFromSafetensors(info["dtype"].get<std::string>());
    if (!dtype.ok()) return DataLoss(where + ": " + dtype.status().message());
    entry.dtype = *dtype;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return DataLoss(where + ": shape must be non-negative integers");
      entry.shape.push_back(d.get<int64_t>());
    }
    // The byte size must be computed without overflow: a crafted shape such as [2^61 + 1]
    // would otherwise wrap to a small number that passes the bounds check below.
    uint64_t expected = c10::elementSize(entry.dtype);
    for (int64_t d : entry.shape)
      if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected) ||
          expected > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return DataLoss(where + ": shape is too large");
    for (const auto& o : info["data_offsets"])
      if (!o.is_number_unsigned()) return DataLoss(where + ": data_offsets must be unsigned");
    entry.begin = info["data_offsets"][0].get<uint64_t>();
    entry.end = info["data_offsets"][1].get<uint64_t>();
    if (entry.end < entry.begin || entry.end > data_size || entry.end - entry.begin != expected)
      return DataLoss(where + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                      std::to_string(entry.end) + ") do not hold " + std::to_string(expected) +
                      " bytes inside the " + std::to_string(data_size) + "-byte data section");
    ranges.emplace_back(entry.begin, entry.end);
    file->entries_.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return DataLoss(path + ": tensors overlap in the data section");
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

StatusOr<torch::Tensor> SafetensorsFile::Read(const std::string& name,
                                              torch::ScalarType dtype) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named \"" + name + "\"");
  TIDAL_ASSIGN_OR_RETURN(torch::Tensor flat, ReadFlatRange(name, 0, it->second.numel(), dtype));
  return flat.view(it->second.shape);
}

StatusOr<torch::Tensor> SafetensorsFile::ReadFlatRange(const std::string& name, int64_t first,
                                                       int64_t count,
                                                       torch::ScalarType dtype) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named \"" + name + "\"");
  const SafetensorsEntry& e = it->second;
  if (first < 0 || count < 0 || first > e.numel() || count > e.numel() - first)
    return InvalidArgument(path_ + ": range [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") outside tensor \"" + name + "\" of " +
                           std::to_string(e.numel()) + " elements");
  const size_t element = c10::elementSize(e.dtype);
  // from_blob over the read-only mapping; the clone/conversion copies out before we return.
  auto view = torch::from_blob(const_cast<uint8_t*>(data_ + e.begin + first * element), {count},
                               torch::TensorOptions().dtype(e.dtype));
  return e.dtype == dtype ? view.clone() : view.to(dtype);
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<safetensors::TensorHeader> headers;
  std::vector<torch::Tensor> host;
  for (const auto& [name, tensor] : tensors) {
    auto dtype = SafetensorsDtypeName(tensor.scalar_type());
    if (!dtype.ok()) return dtype.status().WithContext(path + ": tensor \"" + name + "\"");
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    headers.push_back(
        {name, *dtype, cpu.sizes().vec(), static_cast<uint64_t>(cpu.numel()) * cpu.element_size()});
    host.push_back(std::move(cpu));
  }
  auto head = safetensors::EncodeHeader(headers, metadata);
  if (!head.ok()) return head.status().WithContext(path);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Unavailable(tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(head->data(), 1, head->size(), f) == head->size();
  for (const auto& t : host) {
    const size_t bytes = t.numel() * t.element_size();
    ok = ok && std::fwrite(t.data_ptr(), 1, bytes, f) == bytes;
  }
  ok = (std::fflush(f) == 0) && ok && ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Unavailable(path + ": write failed: " + std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace tidal::engine
