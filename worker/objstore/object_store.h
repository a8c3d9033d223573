// worker/objstore/object_store.h — where checkpoints, token stores and datasets live: one
// small interface over a flat key space, implemented for file:// (a local or shared file
// system) and s3:// (any S3-compatible service, AWS Signature V4). Keys are '/'-separated
// paths relative to the store's root URI ("step-00000015/manifest.json"). No LibTorch here:
// the checkpoint repository, tidal-prep, the data loader and model loading sit on top.
//
// Durability contract (what the checkpoint commit protocol relies on):
//  - Put returns only once the object is durable and complete; readers see the previous
//    version or the new one, never a part (file://: temp file + fsync + rename + fsync of the
//    directory; s3://: a single PUT or a completed multipart upload).
//  - A failed Put leaves no visible object under the key (and aborts a multipart upload).
//  - List is consistent with completed Puts and Deletes of this process.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace tidal::objstore {

struct ObjectInfo {
  std::string key;  // relative to the store's root
  uint64_t size = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // The root URI the store was opened with, normalised ("file:///abs/dir", "s3://bucket/prefix").
  virtual std::string uri() const = 0;

  // Writes the whole object (see the durability contract above). Large objects go up in
  // parallel parts on s3://.
  virtual Status Put(const std::string& key, std::string_view data) = 0;
  // Put of the concatenation of `parts`, which a store may write without concatenating them
  // (file://: one write per part). The default concatenates and calls Put.
  virtual Status PutParts(const std::string& key, const std::vector<std::string_view>& parts);
  // The whole object; NotFound when absent.
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // Bytes [offset, offset + length) of the object; OutOfRange-like InvalidArgument when the
  // range is past its end; NotFound when absent.
  virtual StatusOr<std::string> GetRange(const std::string& key, uint64_t offset,
                                         uint64_t length) = 0;
  // GetRange into `dest` (at least `length` bytes), which a store may fill directly
  // (file://: pread). The default calls GetRange and copies.
  virtual Status GetRangeInto(const std::string& key, uint64_t offset, uint64_t length, char* dest);
  // Bytes [offset, offset + Σ lengths) of the object, scattered in order over `spans`
  // (destination, length). The default reads the range and copies; file:// reads with preadv.
  struct Span {
    char* dest;
    uint64_t length;
  };
  virtual Status GetRangeScatter(const std::string& key, uint64_t offset,
                                 const std::vector<Span>& spans);
  // The object's size, or NotFound.
  virtual StatusOr<uint64_t> Size(const std::string& key) = 0;
  // Every object whose key starts with `prefix`, sorted by key (all pages).
  virtual StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) = 0;
  // Deletes the keys (absent ones are not an error).
  virtual Status Delete(const std::vector<std::string>& keys) = 0;
};

// The defaults are inline so the interface needs no library (the format's code and tests use
// it without the stores).
inline Status ObjectStore::PutParts(const std::string& key,
                                    const std::vector<std::string_view>& parts) {
  size_t size = 0;
  for (std::string_view part : parts) size += part.size();
  std::string whole;
  whole.reserve(size);
  for (std::string_view part : parts) whole.append(part);
  return Put(key, whole);
}

inline Status ObjectStore::GetRangeInto(const std::string& key, uint64_t offset, uint64_t length,
                                        char* dest) {
  TIDAL_ASSIGN_OR_RETURN(std::string bytes, GetRange(key, offset, length));
  std::memcpy(dest, bytes.data(), bytes.size());
  return OkStatus();
}

inline Status ObjectStore::GetRangeScatter(const std::string& key, uint64_t offset,
                                           const std::vector<Span>& spans) {
  uint64_t length = 0;
  for (const Span& span : spans) length += span.length;
  TIDAL_ASSIGN_OR_RETURN(std::string bytes, GetRange(key, offset, length));
  uint64_t at = 0;
  for (const Span& span : spans) {
    std::memcpy(span.dest, bytes.data() + at, span.length);
    at += span.length;
  }
  return OkStatus();
}

// Connection settings for s3:// (file:// needs none). Read by S3OptionsFromEnv from, in
// order: a Secret-style directory (one file per key, as a mounted Kubernetes Secret), then the
// environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or
// AWS_DEFAULT_REGION), AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL), AWS_CA_BUNDLE (ca_file),
// TIDAL_S3_ADDRESSING (path | virtual). The Secret's files have the same names; a value found
// there wins. Without an endpoint: AWS's regional one with virtual-hosted buckets; with one
// (MinIO, Ceph, s3rver): path-style unless TIDAL_S3_ADDRESSING says otherwise.
struct S3Options {
  std::string endpoint;  // "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:4568"
  std::string region = "us-east-1";
  std::string access_key_id, secret_access_key, session_token;
  bool path_style = true;            // false: virtual-hosted (bucket.endpoint-host)
  std::string ca_file;               // extra CA bundle for https endpoints ("" = system store)
  uint64_t part_size = 16ull << 20;  // multipart above this size, parts of this size
  int parallel_parts = 4;
  int max_attempts = 5;  // retries on 5xx, 429, SlowDown and connection errors
  // Waits between attempts: full-jitter exponential backoff, uniform in
  // [0, min(retry_max_delay, retry_base_delay * 2^(failures - 1))) (see s3_retry.h).
  std::chrono::milliseconds retry_base_delay{100};
  std::chrono::milliseconds retry_max_delay{20000};
  int list_max_keys = 1000;  // ListObjectsV2 page size: S3's maximum; smaller to test paging
  // The wall clock requests are signed with (null: the system's). S3 refuses a signature more
  // than 15 minutes off its own time (RequestTimeTooSkewed); the store then signs with the
  // server's time, as the AWS SDKs do. Tests give a clock that is off.
  std::shared_ptr<Clock> clock;
};

// `secret_dir`: "" to skip. `env`: the process environment (passed in for tests). The result
// is validated (ValidateS3Options in s3_store.h): missing credentials are an error naming the
// variable, so call this only for s3:// URIs.
StatusOr<S3Options> S3OptionsFromEnv(const std::string& secret_dir,
                                     const std::map<std::string, std::string>& env);

// "file:///abs/dir", "file://relative/dir" (resolved against the working directory),
// "/abs/dir", or "s3://bucket/prefix". Anything else is refused naming the URI and the
// schemes accepted.
StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& uri,
                                                       const S3Options& s3 = {});

}  // namespace tidal::objstore
