// worker/objstore/memory_store.cc — the in-memory object store.
#include "worker/objstore/memory_store.h"

#include <cstring>

#include "worker/objstore/object_key.h"

namespace tidal::objstore {

Status MemoryStore::Put(const std::string& key, std::string_view data) {
  return Store(key, std::make_shared<const std::string>(data));
}

Status MemoryStore::PutParts(const std::string& key, const std::vector<std::string_view>& parts) {
  size_t size = 0;
  for (std::string_view part : parts) size += part.size();
  auto whole = std::make_shared<std::string>();
  whole->reserve(size);
  for (std::string_view part : parts) whole->append(part);
  return Store(key, std::move(whole));
}

Status MemoryStore::Store(const std::string& key, Bytes data) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  const uint64_t replaced = it == objects_.end() ? 0 : it->second->size();
  const uint64_t after = bytes_ - replaced + data->size();
  if (after > capacity_)
    return FailedPrecondition(uri() + ": putting \"" + key + "\" (" + std::to_string(data->size()) +
                              " bytes) would hold " + std::to_string(after) +
                              " bytes, over its capacity of " + std::to_string(capacity_));
  bytes_ = after;
  objects_[key] = std::move(data);
  return OkStatus();
}

StatusOr<MemoryStore::Bytes> MemoryStore::Find(const std::string& key) const {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return NotFound(uri() + ": key \"" + key + "\" not found");
  return it->second;
}

StatusOr<MemoryStore::Bytes> MemoryStore::FindRange(const std::string& key, uint64_t offset,
                                                    uint64_t length) const {
  TIDAL_ASSIGN_OR_RETURN(Bytes data, Find(key));
  const uint64_t size = data->size();
  if (offset > size || length > size - offset)
    return InvalidArgument(uri() + ": range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + length) + ") of key \"" + key +
                           "\" is past its end (size " + std::to_string(size) + ")");
  return data;
}

StatusOr<std::string> MemoryStore::Get(const std::string& key) {
  TIDAL_ASSIGN_OR_RETURN(Bytes data, Find(key));
  return *data;
}

StatusOr<std::string> MemoryStore::GetRange(const std::string& key, uint64_t offset,
                                            uint64_t length) {
  TIDAL_ASSIGN_OR_RETURN(Bytes data, FindRange(key, offset, length));
  return data->substr(offset, length);
}

Status MemoryStore::GetRangeInto(const std::string& key, uint64_t offset, uint64_t length,
                                 char* dest) {
  TIDAL_ASSIGN_OR_RETURN(Bytes data, FindRange(key, offset, length));
  if (length > 0) std::memcpy(dest, data->data() + offset, length);
  return OkStatus();
}

StatusOr<uint64_t> MemoryStore::Size(const std::string& key) {
  TIDAL_ASSIGN_OR_RETURN(Bytes data, Find(key));
  return static_cast<uint64_t>(data->size());
}

StatusOr<std::vector<ObjectInfo>> MemoryStore::List(const std::string& prefix) {
  TIDAL_RETURN_IF_ERROR(ValidatePrefix(prefix));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectInfo> out;
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back({it->first, it->second->size()});
  return out;
}

Status MemoryStore::Delete(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& key : keys) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    bytes_ -= it->second->size();
    objects_.erase(it);
  }
  return OkStatus();
}

void MemoryStore::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  objects_.clear();
  bytes_ = 0;
}

uint64_t MemoryStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace tidal::objstore
