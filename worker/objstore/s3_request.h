// worker/objstore/s3_request.h — S3 REST requests as pure builders (bucket + key + params →
// http::Request, as kube-rs builds Kubernetes requests), their SigV4 signing, and the mapping
// of S3's error answers to a Status. No sockets here: s3_store.cc sends what these build, and
// tests check them (and botocore's signatures of them) without a server.
// Reference: https://docs.aws.amazon.com/AmazonS3/latest/API/API_Operations.html
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/client.h"
#include "common/http/message.h"
#include "common/status.h"
#include "worker/objstore/sigv4.h"

namespace tidal::objstore::s3 {

// Where buckets are reached.
struct Endpoint {
  http::Origin
      origin;  // the service: "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:4568"
  bool path_style = true;  // "/bucket/key"; false: virtual-hosted, "bucket.host" + "/key"
};

// The origin a bucket's requests go to: the endpoint's, or "<bucket>.<host>" when
// virtual-hosted.
http::Origin BucketOrigin(const Endpoint& endpoint, std::string_view bucket);
// The Host header http::Client sends for `origin` (the port only when not the default), which
// is what gets signed.
std::string HostHeader(const http::Origin& origin);
// A key in a URL path: every byte but A-Z a-z 0-9 - . _ ~ and '/' percent-encoded (botocore's
// encoding of S3's greedy {Key+} label). The same bytes are then signed unchanged.
std::string EncodeKey(std::string_view key);
// Base64 of the body's MD5, for Content-MD5.
std::string ContentMd5(std::string_view body);
// The ETag S3 gives an object made by CompleteMultipartUpload of parts with `part_etags` (as
// UploadPart answered them, quotes included): the MD5 of their MD5s, "-<count>", quoted.
// Empty when an ETag is not a quoted hex MD5 (a server that does not compute them this way).
std::string MultipartEtag(const std::vector<std::string>& part_etags);

struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive, as in "Range: bytes=first-last"
};

http::Request PutObject(const Endpoint& e, std::string_view bucket, std::string_view key,
                        std::string body);
http::Request GetObject(const Endpoint& e, std::string_view bucket, std::string_view key,
                        std::optional<ByteRange> range = std::nullopt);
http::Request HeadObject(const Endpoint& e, std::string_view bucket, std::string_view key);
// `continuation_token` "" for the first page; `max_keys` <= 0 leaves S3's default (1000).
http::Request ListObjectsV2(const Endpoint& e, std::string_view bucket, std::string_view prefix,
                            std::string_view continuation_token, int max_keys);
// Multi-object delete of up to 1000 keys, quiet (only failures are listed in the answer).
http::Request DeleteObjects(const Endpoint& e, std::string_view bucket,
                            const std::vector<std::string>& keys);
http::Request CreateMultipartUpload(const Endpoint& e, std::string_view bucket,
                                    std::string_view key);
http::Request UploadPart(const Endpoint& e, std::string_view bucket, std::string_view key,
                         std::string_view upload_id, int part_number, std::string body);
struct CompletedPart {
  int number = 0;
  std::string etag;  // as UploadPart's ETag header gave it, quotes included
};
http::Request CompleteMultipartUpload(const Endpoint& e, std::string_view bucket,
                                      std::string_view key, std::string_view upload_id,
                                      const std::vector<CompletedPart>& parts);
http::Request AbortMultipartUpload(const Endpoint& e, std::string_view bucket, std::string_view key,
                                   std::string_view upload_id);

// Adds X-Amz-Date, X-Amz-Security-Token (with a session token), x-amz-content-sha256 (the
// body's real hash) and Authorization, signing every header the request carries.
void Sign(http::Request& request, const sigv4::Credentials& credentials, std::string_view region,
          std::chrono::sys_seconds now);

// "bytes 0-9/100" (RFC 9110 §14.4); total is nullopt for "/*".
struct ContentRange {
  uint64_t first = 0, last = 0;
  std::optional<uint64_t> total;
};
std::optional<ContentRange> ParseContentRange(std::string_view value);

// A failed answer as a Status: `what` names the operation and object ("GET
// s3://bucket/prefix/key"); the message carries the HTTP status and S3's Code and Message.
// NoSuchKey (or a bodiless 404) → NotFound naming the key; NoSuchBucket → NotFound naming the
// bucket; 403, credential/clock errors and a wrong region (301 PermanentRedirect,
// AuthorizationHeaderMalformed) → FailedPrecondition; InvalidRange, 400s →
// InvalidArgument; throttling, timeouts and 5xx → Unavailable (retryable); BadDigest →
// DataLoss.
Status ErrorStatus(std::string_view what, int http_status, std::string_view body,
                   std::string_view bucket, std::string_view key);
// S3's Code from an error body ("" when there is none or it is not XML).
std::string ErrorCode(std::string_view body);
// The server's time from a RequestTimeTooSkewed answer: its <ServerTime> (ISO 8601, UTC), else
// its Date header (RFC 9110's IMF-fixdate). nullopt when neither reads.
std::optional<std::chrono::system_clock::time_point> ServerTime(const http::Response& response);

}  // namespace tidal::objstore::s3
