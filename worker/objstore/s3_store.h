// worker/objstore/s3_store.h — the s3:// object store: any S3-compatible service over
// common/http (plain http or verified https), AWS Signature V4 with the real payload hash,
// multipart upload in parallel parts above S3Options::part_size (aborted on any failure),
// ranged GETs, ListObjectsV2 paging, batched DeleteObjects, and retries with full-jitter
// backoff. The requests themselves are built and their answers parsed by the pure code in
// s3_request.h / s3_xml.h; this file is the thin I/O adapter around them.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/http/client.h"
#include "worker/objstore/object_store.h"
#include "worker/objstore/s3_request.h"
#include "worker/objstore/s3_retry.h"

namespace tidal::objstore {

// S3's multipart limits: parts of 5 MiB to 5 GiB (the last may be smaller), at most 10000.
inline constexpr uint64_t kS3MinPartSize = 5ull << 20;
inline constexpr uint64_t kS3MaxPartSize = 5ull << 30;
inline constexpr uint64_t kS3MaxParts = 10000;

// InvalidArgument naming the field unless the options can work: an http(s)://host[:port]
// endpoint, a region, both keys of the credentials, part_size within S3's limits, and sane
// parallelism, attempts, delays and page size.
Status ValidateS3Options(const S3Options& options);
// S3's bucket naming rules: 3-63 characters of a-z 0-9 . -, starting and ending with a letter
// or digit, no "..", not an IP address.
Status ValidateBucketName(const std::string& bucket);

class S3Store final : public ObjectStore {
 public:
  // `prefix`: the root inside the bucket ("" or "jobs/run-1", no leading or trailing '/').
  static StatusOr<std::unique_ptr<S3Store>> Open(const std::string& bucket,
                                                 const std::string& prefix,
                                                 const S3Options& options);

  std::string uri() const override;
  Status Put(const std::string& key, std::string_view data) override;
  StatusOr<std::string> Get(const std::string& key) override;
  StatusOr<std::string> GetRange(const std::string& key, uint64_t offset, uint64_t length) override;
  StatusOr<uint64_t> Size(const std::string& key) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::vector<std::string>& keys) override;

 private:
  S3Store(std::string bucket, std::string prefix, S3Options options, s3::Endpoint endpoint);

  // Sends what `build` makes (signed afresh for each attempt) until it succeeds, fails for
  // good, or max_attempts are spent. `ok_body_may_be_error`: a 2xx whose body is an <Error>
  // is a failure (CompleteMultipartUpload). `error_code`, when given, receives S3's error code
  // of the final failure ("" for none, or no answer).
  StatusOr<http::Response> Call(http::Client& client, const std::function<http::Request()>& build,
                                const std::string& what, const std::string& key,
                                bool ok_body_may_be_error = false,
                                std::string* error_code = nullptr);
  Status PutMultipart(const std::string& key, std::string_view data);
  // Best effort; the error, if any, is returned for the caller to mention.
  Status AbortUpload(const std::string& key, const std::string& upload_id);
  std::string FullKey(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "/" + key;
  }
  std::string UriOf(const std::string& key) const { return uri() + "/" + key; }
  double Uniform();

  const std::string bucket_;
  const std::string prefix_;
  const S3Options options_;
  const s3::Endpoint endpoint_;
  const s3::RetryPolicy retry_;
  std::unique_ptr<http::Client> client_;                     // ordinary requests
  std::vector<std::unique_ptr<http::Client>> part_clients_;  // one per upload thread
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::shared_ptr<Clock> clock_;  // options_.clock, else the system's
  // The server's time minus this node's, in seconds, learnt from a RequestTimeTooSkewed
  // answer: requests are signed with the server's time from then on.
  std::atomic<int64_t> skew_seconds_{0};
};

}  // namespace tidal::objstore
