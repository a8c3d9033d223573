// worker/objstore/file_store.h — the file:// object store: keys are paths under a root
// directory on a local or shared (PVC, NFS) file system. Put is atomic and durable in the
// POSIX way: write a temporary sibling, fsync it, rename it over the key, fsync the directory
// (and every directory it had to create), so a crash leaves the old object or the new one.
// Errors name the path and the system's reason (strerror). POSIX only; no LibTorch.
#pragma once

#include <memory>
#include <string>

#include "worker/objstore/object_store.h"

namespace tidal::objstore {

class FileStore final : public ObjectStore {
 public:
  // `root`: an absolute directory path; created (with its parents) when missing.
  static StatusOr<std::unique_ptr<FileStore>> Open(const std::string& root);

  std::string uri() const override { return "file://" + root_; }
  Status Put(const std::string& key, std::string_view data) override;
  Status PutParts(const std::string& key, const std::vector<std::string_view>& parts) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  Status GetRangeInto(const std::string& key, uint64_t offset, uint64_t length,
                      char* dest) override;
  Status GetRangeScatter(const std::string& key, uint64_t offset,
                         const std::vector<Span>& spans) override;
  StatusOr<uint64_t> Size(const std::string& key) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::vector<std::string>& keys) override;

  const std::string& root() const { return root_; }

 private:
  explicit FileStore(std::string root) : root_(std::move(root)) {}
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }
  StatusOr<int> OpenRange(const std::string& key, uint64_t offset, uint64_t length);
  // Creates the directories between the root and `dir` that are missing, fsyncing each
  // parent that gained an entry.
  Status MakeParents(const std::string& key) const;

  std::string root_;  // absolute, normalised, no trailing '/'
};

}  // namespace tidal::objstore
