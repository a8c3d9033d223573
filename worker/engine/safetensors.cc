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

#include "worker/engine/safetensors_header.h"

namespace tidal::engine {

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // Open() refused shapes whose product overflows
  return n;
}

namespace {
// The dtypes of the safetensors format the engine reads and writes.
constexpr std::pair<const char*, torch::ScalarType> kDtypes[] = {{"F32", torch::kFloat32},
                                                                 {"F16", torch::kFloat16},
                                                                 {"BF16", torch::kBFloat16},
                                                                 {"F64", torch::kFloat64},
                                                                 {"I64", torch::kInt64},
                                                                 {"I32", torch::kInt32},
                                                                 {"I16", torch::kInt16},
                                                                 {"I8", torch::kInt8},
                                                                 {"U8", torch::kUInt8},
                                                                 {"BOOL", torch::kBool},
                                                                 {"F8_E4M3", torch::kFloat8_e4m3fn},
                                                                 {"F8_E5M2", torch::kFloat8_e5m2}};
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
    return safetensors::HeaderLength({}, file->size_, path).status();
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Internal(path + ": mmap failed: " + std::strerror(errno));
  file->map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  TIDAL_ASSIGN_OR_RETURN(
      uint64_t header_len,
      safetensors::HeaderLength(std::string_view(reinterpret_cast<const char*>(bytes), 8),
                                file->size_, path));
  file->data_ = bytes + 8 + header_len;
  TIDAL_RETURN_IF_ERROR(
      file->ParseHeader(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len),
                        file->size_ - 8 - header_len));
  return file;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    ModelFiles& files, const std::string& name, const ModelChecksums::File* checksums,
    uint64_t block_bytes) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = files.Describe(name);
  file->files_ = &files;
  file->name_ = name;
  file->checksums_ = checksums;
  file->block_bytes_ = block_bytes;
  const std::string& path = file->path_;
  TIDAL_ASSIGN_OR_RETURN(uint64_t size, files.Size(name));
  file->size_ = size;
  if (checksums && checksums->size != size)
    return DataLoss(path + ": " + std::to_string(size) + " bytes, " + ModelChecksums::kFileName +
                    " says " + std::to_string(checksums->size) +
                    " (the file changed after its checksums were taken)");
  if (size < 8) return safetensors::HeaderLength({}, size, path).status();
  char length[8];
  TIDAL_RETURN_IF_ERROR(file->ReadBytes(0, 8, length));
  TIDAL_ASSIGN_OR_RETURN(uint64_t header_len,
                         safetensors::HeaderLength(std::string_view(length, 8), size, path));
  std::string header(header_len, '\0');
  TIDAL_RETURN_IF_ERROR(file->ReadBytes(8, header_len, header.data()));
  file->data_offset_ = 8 + header_len;
  TIDAL_RETURN_IF_ERROR(file->ParseHeader(header, size - 8 - header_len));
  return file;
}

Status SafetensorsFile::ReadBytes(uint64_t offset, uint64_t length, char* dest) const {
  if (!checksums_) {
    bytes_read_ += length;
    return files_->ReadRange(name_, offset, length, dest);
  }
  // Whole blocks, each checked against tidal.checksums.json before a byte of it is used; the
  // last block is kept, as neighbouring tensors (and ranks' slices) often share one.
  const uint64_t first = offset / block_bytes_, last = (offset + length - 1) / block_bytes_;
  std::lock_guard<std::mutex> lock(cache_mu_);
  std::string span;
  const uint64_t span_begin = first * block_bytes_;
  const uint64_t span_end = std::min<uint64_t>((last + 1) * block_bytes_, size_);
  if (first == last && cached_block_ == first) {
    span = cached_bytes_;
  } else {
    span.resize(span_end - span_begin);
    TIDAL_RETURN_IF_ERROR(files_->ReadRange(name_, span_begin, span.size(), span.data()));
    bytes_read_ += span.size();
    for (uint64_t b = first; b <= last; ++b) {
      const uint64_t begin = b * block_bytes_ - span_begin;
      const uint64_t n = std::min<uint64_t>(block_bytes_, size_ - b * block_bytes_);
      if (BlockHash(std::string_view(span).substr(begin, n)) != checksums_->blocks.at(b))
        return DataLoss(path_ + ": bytes [" + std::to_string(b * block_bytes_) + ", " +
                        std::to_string(b * block_bytes_ + n) + ") do not match their checksum in " +
                        ModelChecksums::kFileName +
                        " (the file was damaged, or changed after its checksums were taken)");
    }
    cached_block_ = last;
    cached_bytes_ = span.substr((last - first) * block_bytes_);
  }
  std::memcpy(dest, span.data() + (offset - span_begin), length);
  return OkStatus();
}

Status SafetensorsFile::ParseHeader(std::string_view header_bytes, uint64_t data_size) {
  TIDAL_ASSIGN_OR_RETURN(safetensors::ParsedHeader header,
                         safetensors::ParseHeader(header_bytes, data_size, path_));
  metadata_ = std::move(header.metadata);
  for (auto& [name, parsed] : header.tensors) {
    SafetensorsEntry entry;
    TIDAL_ASSIGN_OR_RETURN(entry.dtype, ScalarTypeFromSafetensors(parsed.dtype));
    entry.shape = std::move(parsed.shape);
    entry.begin = parsed.begin;
    entry.end = parsed.end;
    entries_.emplace(name, std::move(entry));
  }
  return OkStatus();
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
  if (files_) {  // by range from the source, verified when it has checksums
    auto raw = torch::empty({count}, torch::TensorOptions().dtype(e.dtype));
    if (count > 0) {
      Status read = ReadBytes(data_offset_ + e.begin + first * element, count * element,
                              static_cast<char*>(raw.data_ptr()));
      if (!read.ok())
        return Status(read.code(), read.message() + " (reading tensor \"" + name + "\")");
    }
    return e.dtype == dtype ? raw : raw.to(dtype);
  }
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
