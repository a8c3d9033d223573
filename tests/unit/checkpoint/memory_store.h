// tests/unit/checkpoint/memory_store.h — an in-memory ObjectStore with the interface's contract
// (atomic Put, ranged Get, sorted List), for unit tests of what sits on top of a store. Puts to
// keys containing `fail_puts_matching_` fail as a full disk would.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "worker/objstore/object_store.h"

namespace tidal::checkpoint {

class MemoryStore : public objstore::ObjectStore {
 public:
  std::string uri() const override { return "mem://test"; }
  Status Put(const std::string& key, std::string_view data) override {
    if (fail_puts_matching_ && key.find(*fail_puts_matching_) != std::string::npos)
      return Unavailable("No space left on device");
    objects_[key] = std::string(data);
    return OkStatus();
  }
  StatusOr<std::string> Get(const std::string& key) override {
    auto it = objects_.find(key);
    if (it == objects_.end()) return NotFound(key);
    return it->second;
  }
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset,
                                 uint64_t length) override {
    auto it = objects_.find(key);
    if (it == objects_.end()) return NotFound(key);
    if (offset + length > it->second.size()) return InvalidArgument(key + ": range past end");
    return it->second.substr(offset, length);
  }
  StatusOr<uint64_t> Size(const std::string& key) override {
    auto it = objects_.find(key);
    if (it == objects_.end()) return NotFound(key);
    return it->second.size();
  }
  StatusOr<std::vector<objstore::ObjectInfo>> List(const std::string& prefix) override {
    std::vector<objstore::ObjectInfo> out;
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      out.push_back({it->first, it->second.size()});
    return out;
  }
  Status Delete(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) objects_.erase(k);
    return OkStatus();
  }
  std::map<std::string, std::string> objects_;
  std::optional<std::string> fail_puts_matching_;
};

}  // namespace tidal::checkpoint
