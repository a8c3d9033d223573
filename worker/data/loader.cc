#include "worker/data/loader.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace tidal::data {
namespace fs = std::filesystem;

BlockCache::BlockCache(objstore::ObjectStore& store, const StoreManifest& manifest,
                       CacheOptions options)
    : store_(store), manifest_(manifest), options_(std::move(options)) {
  if (!options_.dir.empty()) {
    dir_ = options_.dir + "/" + manifest_.content_hash;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) dir_.clear();  // an unusable cache directory only costs speed
    ScanDisk();
  }
}

// Entries left by earlier processes (any store) count against the bound, oldest first.
void BlockCache::ScanDisk() {
  std::vector<std::pair<fs::file_time_type, std::pair<std::string, uint64_t>>> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(options_.dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code kind;
    if (!it->is_regular_file(kind) || it->path().filename().string().starts_with(".")) continue;
    std::error_code stat;
    const auto time = it->last_write_time(stat);
    const uint64_t size = stat ? 0 : it->file_size(stat);
    if (stat) continue;  // removed by another process meanwhile
    found.push_back({time, {it->path().string(), size}});
  }
  std::sort(found.begin(), found.end());
  for (auto& [time, entry] : found) AccountDisk(entry.first, entry.second);
}

std::string BlockCache::ObjectKey(const Key& key) const {
  return manifest_.shards[key.shard].name + (key.mask ? ".mask" : ".ids");
}

std::string BlockCache::CachePath(const Key& key) const {
  return dir_ + "/" + ObjectKey(key) + "." + std::to_string(key.block);
}

const std::string& BlockCache::Checksum(const Key& key) const {
  const StoreShard& shard = manifest_.shards[key.shard];
  return (key.mask ? shard.mask_xxh3 : shard.ids_xxh3)[key.block];
}

uint64_t BlockCache::Length(const Key& key) const {
  const uint64_t tokens =
      std::min(kBlockTokens, manifest_.shards[key.shard].tokens - key.block * kBlockTokens);
  return key.mask ? (tokens + 7) / 8 : tokens * 4;
}

StatusOr<std::string> BlockCache::Fetch(const Key& key) {
  const uint64_t offset = key.mask ? key.block * kBlockTokens / 8 : key.block * kBlockTokens * 4;
  for (int attempt = 0;; ++attempt) {
    TIDAL_ASSIGN_OR_RETURN(std::string bytes, store_.GetRange(ObjectKey(key), offset, Length(key)));
    {
      std::lock_guard lock(mu_);
      ++stats_.blocks_from_store;
      stats_.bytes_from_store += bytes.size();
    }
    if (Xxh3Hex(bytes) == Checksum(key)) return bytes;
    {
      std::lock_guard lock(mu_);
      ++stats_.corrupt_refetched;
    }
    if (attempt == 1)
      return DataLoss(store_.uri() + "/" + ObjectKey(key) + ": block " + std::to_string(key.block) +
                      " fails its checksum (read twice); the store is damaged: run tidal-prep "
                      "again");
  }
}

void BlockCache::AccountDisk(const std::string& path, uint64_t bytes) {
  // Caller holds mu_ (or is the constructor).
  if (auto it = disk_.find(path); it != disk_.end()) {
    disk_bytes_ -= it->second->second;
    disk_lru_.erase(it->second);
  }
  disk_lru_.emplace_back(path, bytes);
  disk_[path] = std::prev(disk_lru_.end());
  disk_bytes_ += bytes;
  while (disk_bytes_ > options_.max_bytes && disk_lru_.size() > 1) {
    auto& [victim, size] = disk_lru_.front();
    std::error_code ec;
    fs::remove(victim, ec);
    disk_bytes_ -= size;
    disk_.erase(victim);
    disk_lru_.pop_front();
    ++stats_.evicted;
  }
}

void BlockCache::Remember(const Key& key, std::shared_ptr<const std::string> block) {
  std::lock_guard lock(mu_);
  memory_.emplace_front(key, std::move(block));
  while (memory_.size() > std::max<uint64_t>(options_.memory_blocks, 1)) memory_.pop_back();
}

StatusOr<std::shared_ptr<const std::string>> BlockCache::Get(uint32_t shard, bool mask,
                                                             uint64_t block) {
  const Key key{shard, mask, block};
  {
    std::unique_lock lock(mu_);
    for (;;) {
      for (auto it = memory_.begin(); it != memory_.end(); ++it) {
        if (it->first != key) continue;
        memory_.splice(memory_.begin(), memory_, it);
        ++stats_.blocks_from_memory;
        return memory_.front().second;
      }
      if (!loading_.count(key)) break;
      loaded_.wait(lock);  // another thread reads it: take its copy from memory
    }
    loading_.insert(key);
  }
  struct Loaded {  // on every way out: the block is no longer being read
    BlockCache* cache;
    Key key;
    ~Loaded() {
      {
        std::lock_guard lock(cache->mu_);
        cache->loading_.erase(key);
      }
      cache->loaded_.notify_all();
    }
  } loaded{this, key};
  if (!dir_.empty()) {
    const std::string path = CachePath(key);
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (bytes.size() == Length(key) && Xxh3Hex(bytes) == Checksum(key)) {
        auto shared = std::make_shared<const std::string>(std::move(bytes));
        {
          std::lock_guard lock(mu_);
          ++stats_.blocks_from_disk;
          AccountDisk(path, shared->size());
        }
        Remember(key, shared);
        return shared;
      }
      std::error_code ec;
      fs::remove(path, ec);  // damaged: fetched again below
      std::lock_guard lock(mu_);
      ++stats_.corrupt_refetched;
    }
  }
  TIDAL_ASSIGN_OR_RETURN(std::string bytes, Fetch(key));
  auto shared = std::make_shared<const std::string>(std::move(bytes));
  if (!dir_.empty()) {
    const std::string path = CachePath(key);
    const std::string tmp =
        path + ".tmp." + std::to_string(::getpid()) + "." +
        std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(shared->data(), static_cast<std::streamsize>(shared->size()));
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      fs::remove(tmp, ec);
    } else {
      std::lock_guard lock(mu_);
      AccountDisk(path, shared->size());
    }
  }
  Remember(key, shared);
  return shared;
}

Status BlockCache::Read(uint32_t shard, bool mask, uint64_t block, uint64_t offset, uint64_t length,
                        char* dest) {
  const Key key{shard, mask, block};
  if (!dir_.empty()) {
    bool verified;
    {
      std::lock_guard lock(mu_);
      verified = verified_.count(key) > 0;
    }
    if (verified) {
      const std::string path = CachePath(key);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      const ssize_t n = fd < 0 ? -1 : ::pread(fd, dest, length, static_cast<off_t>(offset));
      if (fd >= 0) ::close(fd);
      std::lock_guard lock(mu_);
      if (n == static_cast<ssize_t>(length)) {
        ++stats_.ranges_from_disk;
        AccountDisk(path, Length(key));  // most recently used
        return OkStatus();
      }
      verified_.erase(key);  // evicted or replaced meanwhile: read it whole again below
    }
  }
  TIDAL_ASSIGN_OR_RETURN(auto whole, Get(shard, mask, block));
  if (offset + length > whole->size())
    return Internal("block read past its end: " + ObjectKey(key) + " block " +
                    std::to_string(block));
  std::memcpy(dest, whole->data() + offset, length);
  if (!dir_.empty()) {
    std::lock_guard lock(mu_);
    verified_.insert(key);  // Get checked it (from disk or from the store) and cached it
  }
  return OkStatus();
}

LoaderStats BlockCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

StatusOr<std::unique_ptr<RowLoader>> RowLoader::Open(std::unique_ptr<objstore::ObjectStore> store,
                                                     const PackingOptions& packing,
                                                     const CacheOptions& cache,
                                                     const LoaderOptions& loader) {
  std::unique_ptr<RowLoader> l(new RowLoader());
  l->store_ = std::move(store);
  TIDAL_ASSIGN_OR_RETURN(l->index_, StoreIndex::Open(*l->store_));
  l->dataset_ = {.content_hash = l->index_.manifest().content_hash,
                 .samples = l->index_.manifest().samples,
                 .tokenizer = l->index_.manifest().tokenizer};
  const std::vector<uint32_t> lengths = l->index_.Lengths();
  l->plan_ = BuildPackingPlan(lengths, packing);
  if (l->plan_.rows() == 0)
    return InvalidArgument(l->store_->uri() + ": no sample has a token to train on (" +
                           std::to_string(l->plan_.too_short) + " too short, " +
                           std::to_string(l->plan_.dropped) + " longer than maxSeqLen " +
                           std::to_string(packing.seq_len) + " and dropped)");
  l->seq_len_ = packing.seq_len;
  l->options_ = loader;
  l->cache_ = std::make_unique<BlockCache>(*l->store_, l->index_.manifest(), cache);
  l->order_ = std::make_unique<RowOrder>(l->plan_.rows(), packing.seed);
  for (int i = 0; i < std::max(1, loader.threads); ++i)
    l->threads_.emplace_back([raw = l.get()] { raw->Work(); });
  return l;
}

RowLoader::~RowLoader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

uint64_t RowLoader::RowOf(uint64_t sequence) {
  std::lock_guard lock(mu_);
  return order_->RowOf(sequence);
}

Status RowLoader::ReadTokens(const SampleLocation& at, uint32_t length, std::vector<uint32_t>& ids,
                             std::vector<uint8_t>& mask) {
  const uint64_t first = at.begin, last = at.begin + length;  // [first, last) in the shard
  ids.resize(length);
  mask.resize(length);
  for (uint64_t block = first / kBlockTokens; block * kBlockTokens < last; ++block) {
    const uint64_t block_first = block * kBlockTokens;
    const uint64_t from = std::max(first, block_first);
    const uint64_t to = std::min(last, block_first + kBlockTokens);
    TIDAL_RETURN_IF_ERROR(cache_->Read(at.shard, false, block, (from - block_first) * 4,
                                       (to - from) * 4,
                                       reinterpret_cast<char*>(ids.data() + (from - first))));
    const uint64_t byte_first = (from - block_first) / 8, byte_last = (to - block_first + 7) / 8;
    std::string bits(byte_last - byte_first, '\0');
    TIDAL_RETURN_IF_ERROR(
        cache_->Read(at.shard, true, block, byte_first, bits.size(), bits.data()));
    for (uint64_t t = from; t < to; ++t) {
      const uint64_t bit = t - block_first - byte_first * 8;
      mask[t - first] = (static_cast<uint8_t>(bits[bit / 8]) >> (bit % 8)) & 1;
    }
  }
  return OkStatus();
}

StatusOr<engine::PackedRow> RowLoader::ReadRow(uint64_t row) {
  engine::PackedRow out;
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  int32_t document = 0;
  for (const Segment& segment : plan_.Row(row)) {
    TIDAL_RETURN_IF_ERROR(ReadTokens(index_.at(segment.sample), segment.length, ids, mask));
    for (uint32_t i = 0; i < segment.length; ++i) {
      out.tokens.push_back(ids[i]);
      const bool trains = i + 1 < segment.length && mask[i + 1];
      out.targets.push_back(trains ? static_cast<int32_t>(ids[i + 1]) : -100);
      out.positions.push_back(static_cast<int32_t>(i));
      out.documents.push_back(document);
    }
    out.samples.push_back(segment.sample);
    ++document;
  }
  return out;
}

void RowLoader::Work() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const uint64_t sequence = queue_.front();
    queue_.pop_front();
    in_flight_.insert(sequence);
    const uint64_t row = order_->RowOf(sequence);
    lock.unlock();
    StatusOr<engine::PackedRow> result = Internal("unset");
    try {
      result = ReadRow(row);
    } catch (const std::exception& e) {  // bad_alloc and the like: the reader gets the error
      result = Internal(std::string("reading row ") + std::to_string(row) + ": " + e.what());
    }
    lock.lock();
    in_flight_.erase(sequence);
    ready_.insert_or_assign(sequence, std::move(result));
    cv_.notify_all();
  }
}

void RowLoader::Prefetch(std::span<const uint64_t> sequences) {
  {
    std::lock_guard lock(mu_);
    for (uint64_t sequence : sequences) {
      const uint64_t held = queue_.size() + in_flight_.size() + ready_.size();
      if (held >= static_cast<uint64_t>(std::max<int64_t>(options_.lookahead, 1))) break;
      if (ready_.count(sequence) || in_flight_.count(sequence) ||
          std::find(queue_.begin(), queue_.end(), sequence) != queue_.end())
        continue;
      queue_.push_back(sequence);
    }
  }
  cv_.notify_all();
}

StatusOr<engine::PackedRow> RowLoader::Sequence(uint64_t k) {
  std::unique_lock lock(mu_);
  // A rank reads its sequences in increasing order: rows before k are no longer wanted (a
  // rescale changed which rows this rank reads) and would only hold prefetch slots.
  ready_.erase(ready_.begin(), ready_.lower_bound(k));
  if (auto queued = std::find(queue_.begin(), queue_.end(), k); queued != queue_.end()) {
    queue_.erase(queued);  // needed now: read it on this thread rather than wait in line
  } else {
    cv_.wait(lock, [&] { return ready_.count(k) || !in_flight_.count(k); });
  }
  if (auto it = ready_.find(k); it != ready_.end()) {
    StatusOr<engine::PackedRow> row = std::move(it->second);
    ready_.erase(it);
    return row;
  }
  const uint64_t row = order_->RowOf(k);
  lock.unlock();
  return ReadRow(row);
}

Status RowLoader::Warm(std::span<const uint64_t> sequences) {
  const size_t threads = static_cast<size_t>(std::max(1, options_.threads));
  std::vector<Status> results(threads);
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (size_t i = t; i < sequences.size() && results[t].ok(); i += threads)
        results[t] = ReadRow(RowOf(sequences[i])).status();
    });
  for (std::thread& w : workers) w.join();
  for (const Status& s : results) TIDAL_RETURN_IF_ERROR(s);
  return OkStatus();
}

}  // namespace tidal::data
