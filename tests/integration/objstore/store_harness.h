// tests/integration/objstore/store_harness.h — what the object store tests share: test data,
// the s3:// options that reach the S3 test server, parallel puts, and a look for leftover temp
// files.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/objstore/s3_server.h"
#include "worker/objstore/object_key.h"
#include "worker/objstore/object_store.h"

namespace tidal::testing {

inline constexpr uint64_t kMiB = 1ull << 20;

// `n` bytes that differ per seed and include zeros and every byte value.
inline std::string TestBytes(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

// Options that reach `server` at `endpoint` (its own, or a proxy's in front of it): its
// credentials, S3's smallest parts (5 MiB) so that a 16 MiB object goes up in 4 parts, and
// short retry delays.
inline objstore::S3Options S3TestOptions(const S3Server& server, const std::string& endpoint) {
  objstore::S3Options o;
  o.endpoint = endpoint;
  o.access_key_id = server.access_key();
  o.secret_access_key = server.secret_key();
  o.path_style = true;
  o.part_size = 5 * kMiB;
  o.parallel_parts = 3;
  o.retry_base_delay = std::chrono::milliseconds(1);
  o.retry_max_delay = std::chrono::milliseconds(20);
  return o;
}

// Puts every key (data by TestBytes(size, index)) from `threads` threads; the first error.
inline Status PutMany(objstore::ObjectStore& store, const std::vector<std::string>& keys,
                      size_t size, int threads = 8) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      for (size_t i = next++; i < keys.size(); i = next++) {
        Status s = store.Put(keys[i], TestBytes(size, static_cast<uint32_t>(i)));
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = s;
          return;
        }
      }
    });
  for (auto& w : workers) w.join();
  return first;
}

// Files under `root` whose name marks a file store temporary.
inline std::vector<std::string> TempFilesUnder(const std::string& root) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->path().filename().string().rfind(std::string(objstore::kTempPrefix), 0) == 0)
      found.push_back(it->path().string());
  return found;
}

#define TIDAL_ASSERT_OK(expr)                          \
  do {                                                 \
    ::tidal::Status tidal_s_ = (expr);                 \
    ASSERT_TRUE(tidal_s_.ok()) << tidal_s_.ToString(); \
  } while (0)

}  // namespace tidal::testing
