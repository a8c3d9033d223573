// worker/objstore/memory_store.h — an object store in this process's memory: where a worker
// keeps the state it serves to its peers (a live rescale's checkpoint, DESIGN.md §4 step 5),
// so that the next generation reads it over the network instead of through the durable store.
// Same contract as the other stores (keys checked by ValidateKey, ranged reads, NotFound, a
// failed Put keeps the previous object), bounded by a capacity in bytes: a Put that would pass
// it is refused (FailedPrecondition, naming the capacity) and changes nothing. Nothing here
// survives the process. Thread-safe; readers share an object's bytes with a Put that replaces it
// (no copy under the lock). No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "worker/objstore/object_store.h"

namespace tidal::objstore {

class MemoryStore final : public ObjectStore {
 public:
  // `name` makes the URI ("mem://<name>"), for logs and errors. `capacity_bytes`: the most the
  // objects may hold together.
  explicit MemoryStore(std::string name, uint64_t capacity_bytes = UINT64_MAX)
      : name_(std::move(name)), capacity_(capacity_bytes) {}

  std::string uri() const override { return "mem://" + name_; }
  Status Put(const std::string& key, std::string_view data) override;
  Status PutParts(const std::string& key, const std::vector<std::string_view>& parts) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  Status GetRangeInto(const std::string& key, uint64_t offset, uint64_t length,
                      char* dest) override;
  StatusOr<uint64_t> Size(const std::string& key) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::vector<std::string>& keys) override;

  // Deletes every object.
  void Clear();
  // What the objects hold together.
  uint64_t bytes() const;

 private:
  using Bytes = std::shared_ptr<const std::string>;
  Status Store(const std::string& key, Bytes data);
  StatusOr<Bytes> Find(const std::string& key) const;
  // The bytes of [offset, offset + length) of `key`, checked against its size.
  StatusOr<Bytes> FindRange(const std::string& key, uint64_t offset, uint64_t length) const;

  const std::string name_;
  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<std::string, Bytes> objects_;
  uint64_t bytes_ = 0;
};

}  // namespace tidal::objstore
