// worker/data/loader.h — how a rank gets its training rows: it reads only the blocks of the
// token store its rows touch, by range, through a node-local, size-bounded, checksummed cache
// directory (an emptyDir or hostPath that outlives the process), with background threads that
// fetch the next rows while the GPU works. No LibTorch: rows come out as plain vectors; the
// engine's collate step makes tensors of them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "worker/data/packing.h"
#include "worker/data/token_store.h"
#include "worker/engine/row_source.h"
#include "worker/objstore/object_store.h"

namespace tidal::data {

struct CacheOptions {
  std::string dir;  // "" = no disk cache (blocks are kept in memory only)
  uint64_t max_bytes = uint64_t{8} << 30;
  uint64_t memory_blocks = 32;  // verified blocks kept in memory, least recently used out
};

struct LoaderOptions {
  int64_t lookahead = 64;  // rows fetched ahead of the one being trained on
  int threads = 2;         // fetch threads
};

struct LoaderStats {
  uint64_t blocks_from_store = 0, blocks_from_disk = 0, blocks_from_memory = 0;
  uint64_t ranges_from_disk = 0;  // reads of part of a verified cache file
  uint64_t bytes_from_store = 0;
  uint64_t corrupt_refetched = 0;  // blocks whose checksum failed once (cache or store)
  uint64_t evicted = 0;
};

// Verified blocks of a store's .ids and .mask files. Thread-safe.
class BlockCache {
 public:
  BlockCache(objstore::ObjectStore& store, const StoreManifest& manifest, CacheOptions options);
  // Block `block` of shard `shard` (its .mask file when `mask`): from memory, the cache
  // directory (checksum verified; a damaged file is deleted and fetched again), or the store by
  // range (fetched twice when the checksum fails, then DataLoss naming the object).
  StatusOr<std::shared_ptr<const std::string>> Get(uint32_t shard, bool mask, uint64_t block);
  // Bytes [offset, offset + length) of that block into `dest`. A cache file verified once by
  // this process is read by range (pread), not whole: rows pick samples all over the store.
  Status Read(uint32_t shard, bool mask, uint64_t block, uint64_t offset, uint64_t length,
              char* dest);
  LoaderStats stats() const;

 private:
  struct Key {
    uint32_t shard;
    bool mask;
    uint64_t block;
    auto operator<=>(const Key&) const = default;
  };
  std::string ObjectKey(const Key& key) const;
  std::string CachePath(const Key& key) const;
  const std::string& Checksum(const Key& key) const;
  uint64_t Length(const Key& key) const;
  StatusOr<std::string> Fetch(const Key& key);
  void Remember(const Key& key, std::shared_ptr<const std::string> block);
  void AccountDisk(const std::string& path, uint64_t bytes);
  void ScanDisk();

  objstore::ObjectStore& store_;
  const StoreManifest& manifest_;
  CacheOptions options_;
  std::string dir_;  // options_.dir/<content hash>
  mutable std::mutex mu_;
  std::condition_variable loaded_;
  std::set<Key> loading_;   // blocks a thread is reading now: others wait rather than fetch too
  std::set<Key> verified_;  // cache files this process has checked against the manifest
  std::list<std::pair<Key, std::shared_ptr<const std::string>>> memory_;  // most recent first
  // Disk entries (all stores under options_.dir), least recently used first.
  std::list<std::pair<std::string, uint64_t>> disk_lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, uint64_t>>::iterator> disk_;
  uint64_t disk_bytes_ = 0;
  LoaderStats stats_;
};

class RowLoader : public engine::RowSource {
 public:
  // Opens the store at `store` (its manifest and indexes, verified), builds the packing plan.
  static StatusOr<std::unique_ptr<RowLoader>> Open(std::unique_ptr<objstore::ObjectStore> store,
                                                   const PackingOptions& packing,
                                                   const CacheOptions& cache,
                                                   const LoaderOptions& loader);
  ~RowLoader() override;

  const StoreManifest& manifest() const { return index_.manifest(); }
  const engine::DatasetFacts& dataset() const override { return dataset_; }
  const PackingPlan& plan() const { return plan_; }
  uint64_t rows() const override { return plan_.rows(); }
  uint64_t RowOf(uint64_t sequence);

  // Sequences this rank reads next, in order: fetched in the background, at most `lookahead`
  // rows held or in flight (the rest of the list is ignored; call again after each step).
  void Prefetch(std::span<const uint64_t> sequences) override;
  // Row of sequence `k`: a prefetched one, waiting for it if in flight, else read now.
  StatusOr<engine::PackedRow> Sequence(uint64_t k) override;
  // Reads the blocks of these sequences into the cache before training starts.
  Status Warm(std::span<const uint64_t> sequences) override;
  LoaderStats stats() const { return cache_->stats(); }

 private:
  RowLoader() = default;
  StatusOr<engine::PackedRow> ReadRow(uint64_t row);
  Status ReadTokens(const SampleLocation& at, uint32_t length, std::vector<uint32_t>& ids,
                    std::vector<uint8_t>& mask);
  void Work();

  std::unique_ptr<objstore::ObjectStore> store_;
  StoreIndex index_;
  engine::DatasetFacts dataset_;  // from the index's manifest
  PackingPlan plan_;
  std::unique_ptr<BlockCache> cache_;
  LoaderOptions options_;
  int64_t seq_len_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<RowOrder> order_;
  std::deque<uint64_t> queue_;  // sequences to fetch
  std::set<uint64_t> in_flight_;
  std::map<uint64_t, StatusOr<engine::PackedRow>> ready_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tidal::data
