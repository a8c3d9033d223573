// worker/objstore/s3_store.cc
#include "worker/objstore/s3_store.h"

#include <openssl/x509.h>

#include <atomic>
#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "worker/objstore/object_key.h"
#include "worker/objstore/s3_xml.h"

namespace tidal::objstore {
namespace {

// S3's multi-object delete takes at most this many keys.
constexpr size_t kDeleteBatch = 1000;
// Limits that keep a typo from turning into thousands of threads or hours of retrying.
constexpr int kMaxParallelParts = 64;
constexpr int kMaxAttempts = 20;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The trust store for https: the system's CA bundle plus `extra_ca_file`.
StatusOr<std::string> CaBundle(const std::string& extra_ca_file) {
  std::string pem;
  for (const std::string& path : {std::string(X509_get_default_cert_file()),
                                  std::string("/etc/ssl/certs/ca-certificates.crt"),
                                  std::string("/etc/pki/tls/certs/ca-bundle.crt")}) {
    if (auto system = ReadFile(path); system.ok()) {
      pem = *system;
      break;
    }
  }
  if (!extra_ca_file.empty()) {
    auto extra = ReadFile(extra_ca_file);
    if (!extra.ok())
      return InvalidArgument("s3 options: ca_file \"" + extra_ca_file + "\" cannot be read");
    pem += "\n" + *extra;
  }
  if (pem.empty())
    return FailedPrecondition("s3: no CA bundle found for https (looked for the system's at " +
                              std::string(X509_get_default_cert_file()) +
                              "); set ca_file (AWS_CA_BUNDLE)");
  return pem;
}

bool LooksLikeIpAddress(const std::string& host) {
  if (host.find(':') != std::string::npos) return true;  // IPv6
  return !host.empty() && host.find_first_not_of("0123456789.") == std::string::npos;
}

}  // namespace

Status ValidateBucketName(const std::string& bucket) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("s3 bucket \"" + bucket + "\": " + why);
  };
  if (bucket.size() < 3 || bucket.size() > 63) return bad("must be 3 to 63 characters long");
  if (bucket.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") != std::string::npos)
    return bad("only lowercase letters, digits, '.' and '-' are allowed");
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (!alnum(bucket.front()) || !alnum(bucket.back()))
    return bad("must start and end with a letter or digit");
  if (bucket.find("..") != std::string::npos) return bad("may not contain \"..\"");
  if (LooksLikeIpAddress(bucket)) return bad("may not be formatted as an IP address");
  return OkStatus();
}

Status ValidateS3Options(const S3Options& o) {
  auto bad = [](const std::string& why) { return InvalidArgument("s3 options: " + why); };
  auto origin = http::ParseOrigin(o.endpoint);
  if (!origin.ok())
    return bad("endpoint \"" + o.endpoint + "\": " + origin.status().message() +
               " (AWS_ENDPOINT_URL_S3)");
  if (!o.path_style && LooksLikeIpAddress(origin->host))
    return bad(
        "virtual-hosted addressing needs a DNS name, but the endpoint's host is the "
        "address " +
        origin->host + " (set TIDAL_S3_ADDRESSING=path)");
  if (o.region.empty() ||
      o.region.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)
    return bad("region \"" + o.region + "\": expected a region name like us-east-1 (AWS_REGION)");
  if (o.access_key_id.empty())
    return bad("access_key_id is empty (AWS_ACCESS_KEY_ID in the environment or the Secret)");
  if (o.secret_access_key.empty())
    return bad(
        "secret_access_key is empty (AWS_SECRET_ACCESS_KEY in the environment or the "
        "Secret)");
  if (o.part_size < kS3MinPartSize || o.part_size > kS3MaxPartSize)
    return bad("part_size " + std::to_string(o.part_size) + " is outside S3's part sizes [" +
               std::to_string(kS3MinPartSize) + ", " + std::to_string(kS3MaxPartSize) + "]");
  if (o.parallel_parts < 1 || o.parallel_parts > kMaxParallelParts)
    return bad("parallel_parts " + std::to_string(o.parallel_parts) + " is outside [1, " +
               std::to_string(kMaxParallelParts) + "]");
  if (o.max_attempts < 1 || o.max_attempts > kMaxAttempts)
    return bad("max_attempts " + std::to_string(o.max_attempts) + " is outside [1, " +
               std::to_string(kMaxAttempts) + "]");
  if (o.retry_base_delay.count() < 0 || o.retry_max_delay < o.retry_base_delay)
    return bad("retry delays: expected 0 <= retry_base_delay <= retry_max_delay, got " +
               std::to_string(o.retry_base_delay.count()) + " ms and " +
               std::to_string(o.retry_max_delay.count()) + " ms");
  if (o.list_max_keys < 1 || o.list_max_keys > 1000)
    return bad("list_max_keys " + std::to_string(o.list_max_keys) + " is outside [1, 1000]");
  return OkStatus();
}

S3Store::S3Store(std::string bucket, std::string prefix, S3Options options, s3::Endpoint endpoint)
    : bucket_(std::move(bucket)),
      prefix_(std::move(prefix)),
      options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      retry_{options_.max_attempts, options_.retry_base_delay, options_.retry_max_delay},
      rng_(std::random_device{}()),
      clock_(options_.clock ? options_.clock : RealClock::Get()) {}

StatusOr<std::unique_ptr<S3Store>> S3Store::Open(const std::string& bucket,
                                                 const std::string& prefix,
                                                 const S3Options& options) {
  TIDAL_RETURN_IF_ERROR(ValidateBucketName(bucket));
  if (!prefix.empty()) {
    Status valid = ValidateKey(prefix);
    if (!valid.ok()) return InvalidArgument("s3 prefix: " + valid.message());
  }
  TIDAL_RETURN_IF_ERROR(ValidateS3Options(options));
  s3::Endpoint endpoint{*http::ParseOrigin(options.endpoint), options.path_style};
  http::ClientOptions client_options;
  client_options.origin = s3::BucketOrigin(endpoint, bucket);
  // Whole objects come back in one response; the caller asked for them.
  client_options.max_response_bytes = std::numeric_limits<size_t>::max();
  if (client_options.origin.scheme == "https") {
    TIDAL_ASSIGN_OR_RETURN(std::string ca, CaBundle(options.ca_file));
    auto tls = http::TlsContext::Client(ca);
    if (!tls.ok()) return tls.status().WithContext("s3: loading the CA bundle");
    client_options.tls = *tls;
  }
  std::unique_ptr<S3Store> store(new S3Store(bucket, prefix, options, endpoint));
  TIDAL_ASSIGN_OR_RETURN(store->client_, http::Client::Create(client_options));
  for (int i = 0; i < options.parallel_parts; ++i) {
    TIDAL_ASSIGN_OR_RETURN(auto client, http::Client::Create(client_options));
    store->part_clients_.push_back(std::move(client));
  }
  return store;
}

std::string S3Store::uri() const {
  return "s3://" + bucket_ + (prefix_.empty() ? "" : "/" + prefix_);
}

double S3Store::Uniform() {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

StatusOr<http::Response> S3Store::Call(http::Client& client,
                                       const std::function<http::Request()>& build,
                                       const std::string& what, const std::string& key,
                                       bool ok_body_may_be_error, std::string* error_code) {
  bool resigned = false;  // once per call: signed again with the server's time
  for (int attempt = 1;; ++attempt) {
    http::Request request = build();
    s3::Sign(request, {options_.access_key_id, options_.secret_access_key, options_.session_token},
             options_.region,
             std::chrono::floor<std::chrono::seconds>(clock_->WallNow()) +
                 std::chrono::seconds(skew_seconds_.load()));
    StatusOr<http::Response> response = client.Send(std::move(request));
    if (response.ok() && !resigned && response->status == 403 &&
        s3::ErrorCode(response->body) == "RequestTimeTooSkewed") {
      if (auto server = s3::ServerTime(*response)) {
        const int64_t skew =
            std::chrono::duration_cast<std::chrono::seconds>(
                *server - std::chrono::floor<std::chrono::seconds>(clock_->WallNow()))
                .count();
        if (skew_seconds_.exchange(skew) != skew)
          LogWarn(
              "s3: this node's clock is off the store's; requests are signed with the "
              "store's time from now on",
              {{"skew_seconds", skew}, {"endpoint", options_.endpoint}});
        resigned = true;
        --attempt;  // not a failure of the store's: no backoff, no attempt used
        continue;
      }
    }
    Status failure;
    bool retryable = false;
    std::string code;
    if (!response.ok()) {
      // No answer. The transport reports a peer that hung up as NotFound, which here would read
      // as "no such object": it is Unavailable.
      const Status& transport = response.status();
      failure = Status(
          transport.code() == StatusCode::kNotFound ? StatusCode::kUnavailable : transport.code(),
          "s3: " + what + ": " + transport.message());
      retryable = s3::IsRetryableTransportError(transport);
    } else {
      bool success = response->status / 100 == 2;
      if (success && ok_body_may_be_error) {
        code = s3::ErrorCode(response->body);
        success = code.empty();
      }
      if (success) return response;
      if (code.empty()) code = s3::ErrorCode(response->body);
      failure = s3::ErrorStatus(what, response->status, response->body, bucket_, key);
      retryable = s3::IsRetryableAnswer(response->status, code);
    }
    if (!retryable || attempt >= retry_.max_attempts) {
      if (error_code) *error_code = code;
      if (attempt == 1) return failure;
      return Status(failure.code(),
                    failure.message() + " (after " + std::to_string(attempt) + " attempts)");
    }
    std::this_thread::sleep_for(s3::BackoffDelay(retry_, attempt, Uniform()));
  }
}

Status S3Store::Put(const std::string& key, std::string_view data) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string full = FullKey(key);
  if (full.size() > kMaxKeyBytes)
    return InvalidArgument("s3: key \"" + full + "\" is longer than S3's " +
                           std::to_string(kMaxKeyBytes) + " bytes");
  if (data.size() > options_.part_size) return PutMultipart(key, data);
  auto response = Call(
      *client_, [&] { return s3::PutObject(endpoint_, bucket_, full, std::string(data)); },
      "PUT " + UriOf(key), key);
  return response.status();
}

Status S3Store::AbortUpload(const std::string& key, const std::string& upload_id) {
  auto response = Call(
      *client_,
      [&] { return s3::AbortMultipartUpload(endpoint_, bucket_, FullKey(key), upload_id); },
      "abort multipart upload " + upload_id + " of " + UriOf(key), key);
  if (!response.ok() && response.status().code() != StatusCode::kNotFound) {
    LogWarn(
        "s3: could not abort a multipart upload; its parts stay stored until a lifecycle "
        "rule removes them",
        {{"uri", UriOf(key)}, {"upload_id", upload_id}, {"error", response.status().message()}});
    return response.status();
  }
  return OkStatus();
}

Status S3Store::PutMultipart(const std::string& key, std::string_view data) {
  const std::string full = FullKey(key);
  const std::string uri = UriOf(key);
  const uint64_t part_size = options_.part_size;
  const uint64_t parts = (data.size() + part_size - 1) / part_size;
  if (parts > kS3MaxParts)
    return InvalidArgument("s3: PUT " + uri + ": " + std::to_string(data.size()) +
                           " bytes in parts of " + std::to_string(part_size) + " need " +
                           std::to_string(parts) + " parts, more than S3's " +
                           std::to_string(kS3MaxParts) + "; raise part_size");

  auto created = Call(
      *client_, [&] { return s3::CreateMultipartUpload(endpoint_, bucket_, full); },
      "create multipart upload of " + uri, key);
  if (!created.ok()) return created.status();
  auto parsed = s3::ParseInitiateMultipartUpload(created->body);
  if (!parsed.ok()) return parsed.status().WithContext("s3: create multipart upload of " + uri);
  const std::string upload_id = *parsed;

  // Any failure from here on aborts the upload, so no part outlives a failed Put.
  auto fail = [&](const Status& error) {
    Status aborted = AbortUpload(key, upload_id);
    if (aborted.ok()) return error;
    return Status(error.code(), error.message() + "; aborting upload " + upload_id +
                                    " failed too: " + aborted.message());
  };

  std::vector<s3::CompletedPart> completed(parts);
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status first_error;
  auto upload = [&](http::Client& client) {
    while (!failed.load()) {
      const uint64_t index = next.fetch_add(1);
      if (index >= parts) return;
      const int number = static_cast<int>(index + 1);
      std::string_view body = data.substr(index * part_size, part_size);
      const std::string what =
          "PUT part " + std::to_string(number) + " of " + std::to_string(parts) + " of " + uri;
      auto response = Call(
          client,
          [&] {
            return s3::UploadPart(endpoint_, bucket_, full, upload_id, number, std::string(body));
          },
          what, key);
      Status error = response.status();
      if (response.ok()) {
        auto etag = response->headers.Get("etag");
        if (etag && !etag->empty())
          completed[index] = {number, *etag};
        else
          error = Internal("s3: " + what + ": the answer has no ETag header");
      }
      if (!error.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.ok()) first_error = error;
        failed.store(true);
        return;
      }
    }
  };
  const size_t workers = std::min<uint64_t>(parts, part_clients_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers; ++i) threads.emplace_back(upload, std::ref(*part_clients_[i]));
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return fail(first_error);

  std::string code;
  auto done = Call(
      *client_,
      [&] { return s3::CompleteMultipartUpload(endpoint_, bucket_, full, upload_id, completed); },
      "complete multipart upload of " + uri, key, /*ok_body_may_be_error=*/true, &code);
  if (!done.ok() && code == "NoSuchUpload") {
    // S3 applied an earlier attempt whose answer was lost (a reset connection, a 5xx from a
    // proxy), and the retry finds the upload gone. The object is ours when it carries the ETag
    // S3 gives exactly these parts; anything else (none, another writer's) is the failure.
    std::vector<std::string> etags;
    for (const s3::CompletedPart& part : completed) etags.push_back(part.etag);
    const std::string expected = s3::MultipartEtag(etags);
    auto head = Call(
        *client_, [&] { return s3::HeadObject(endpoint_, bucket_, full); }, "HEAD " + uri, key);
    if (!expected.empty() && head.ok() && head->headers.Get("etag") == expected) {
      LogInfo("s3: a multipart upload's completion answer was lost; the object is there",
              {{"uri", uri}, {"upload_id", upload_id}, {"etag", expected}});
      return OkStatus();
    }
  }
  if (!done.ok()) return fail(done.status());
  return OkStatus();
}

StatusOr<std::string> S3Store::Get(const std::string& key) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  TIDAL_ASSIGN_OR_RETURN(
      http::Response response,
      Call(
          *client_, [&] { return s3::GetObject(endpoint_, bucket_, FullKey(key)); },
          "GET " + UriOf(key), key));
  return std::move(response.body);
}

StatusOr<std::string> S3Store::GetRange(const std::string& key, uint64_t offset, uint64_t length) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string uri = UriOf(key);
  const std::string range_text =
      "[" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
  auto past_end = [&](const std::string& size) {
    return InvalidArgument("s3: GET " + uri + ": range " + range_text +
                           " is past the end of the object (size " + size + ")");
  };
  if (length == 0 || offset > std::numeric_limits<uint64_t>::max() - length) {
    // No byte to ask for (a Range header cannot say "nothing"): only check the bounds.
    TIDAL_ASSIGN_OR_RETURN(uint64_t size, Size(key));
    if (offset > size || length > size - offset) return past_end(std::to_string(size));
    return std::string();
  }
  const uint64_t last = offset + length - 1;
  auto answer = Call(
      *client_,
      [&] {
        return s3::GetObject(endpoint_, bucket_, FullKey(key), s3::ByteRange{offset, last});
      },
      "GET " + uri + " range " + range_text, key);
  if (!answer.ok()) {
    // 416 InvalidRange: the range starts at or after the end of the object.
    const Status& error = answer.status();
    if (error.code() == StatusCode::kInvalidArgument &&
        (error.message().find("InvalidRange") != std::string::npos ||
         error.message().find("HTTP 416") != std::string::npos))
      return InvalidArgument("s3: GET " + uri + ": range " + range_text +
                             " is past the end of the object (" + error.message() + ")");
    return error;
  }
  http::Response& response = *answer;
  if (response.status == 200) {
    // The server ignored Range and sent everything (allowed by RFC 9110 §14.2).
    if (offset > response.body.size() || length > response.body.size() - offset)
      return past_end(std::to_string(response.body.size()));
    return response.body.substr(offset, length);
  }
  auto header = response.headers.Get("content-range");
  auto range = header ? s3::ParseContentRange(*header) : std::nullopt;
  if (response.status != 206 || !range)
    return Internal("s3: GET " + uri + " range " + range_text + ": expected 206 with a " +
                    "Content-Range, got HTTP " + std::to_string(response.status) +
                    (header ? " and Content-Range \"" + *header + "\"" : " without one"));
  if (range->total && (offset >= *range->total || length > *range->total - offset))
    return past_end(std::to_string(*range->total));
  if (range->first > offset || range->last < last)
    return past_end("unknown; the server sent bytes " + *header);
  if (response.body.size() != range->last - range->first + 1)
    return DataLoss("s3: GET " + uri + ": Content-Range \"" + *header + "\" announces " +
                    std::to_string(range->last - range->first + 1) + " bytes, the body has " +
                    std::to_string(response.body.size()));
  // Some servers answer a larger range than asked (s3rver: "bytes=0-0" → the whole object).
  return response.body.substr(offset - range->first, length);
}

StatusOr<uint64_t> S3Store::Size(const std::string& key) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  TIDAL_ASSIGN_OR_RETURN(
      http::Response response,
      Call(
          *client_, [&] { return s3::HeadObject(endpoint_, bucket_, FullKey(key)); },
          "HEAD " + UriOf(key), key));
  auto length = response.headers.Get("content-length");
  uint64_t size = 0;
  if (!length ||
      std::from_chars(length->data(), length->data() + length->size(), size).ptr !=
          length->data() + length->size() ||
      length->empty())
    return Internal("s3: HEAD " + UriOf(key) + ": the answer has no valid Content-Length");
  return size;
}

StatusOr<std::vector<ObjectInfo>> S3Store::List(const std::string& prefix) {
  TIDAL_RETURN_IF_ERROR(ValidatePrefix(prefix));
  const std::string root = prefix_.empty() ? "" : prefix_ + "/";
  const std::string full_prefix = root + prefix;
  std::vector<ObjectInfo> out;
  std::string token;
  for (int page_number = 1;; ++page_number) {
    const std::string what = "ListObjectsV2 of s3://" + bucket_ + "/" + full_prefix + " (page " +
                             std::to_string(page_number) + ")";
    TIDAL_ASSIGN_OR_RETURN(http::Response response, Call(
                                                        *client_,
                                                        [&] {
                                                          return s3::ListObjectsV2(
                                                              endpoint_, bucket_, full_prefix,
                                                              token, options_.list_max_keys);
                                                        },
                                                        what, ""));
    auto page = s3::ParseListObjectsV2(response.body);
    if (!page.ok()) return page.status().WithContext("s3: " + what);
    for (ObjectInfo& object : page->objects) {
      if (object.key.compare(0, root.size(), root) != 0) continue;
      object.key.erase(0, root.size());
      // Skip what this store could not have written, such as the "folder/" markers S3
      // consoles create.
      if (!ValidateKey(object.key).ok()) continue;
      out.push_back(std::move(object));
    }
    if (!page->truncated) break;
    if (page->next_continuation_token == token)
      return Internal("s3: " + what + ": the server repeated the continuation token");
    token = page->next_continuation_token;
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Status S3Store::Delete(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  for (size_t start = 0; start < keys.size(); start += kDeleteBatch) {
    std::vector<std::string> batch;
    for (size_t i = start; i < std::min(keys.size(), start + kDeleteBatch); ++i)
      batch.push_back(FullKey(keys[i]));
    const std::string what = "DeleteObjects of " + std::to_string(batch.size()) + " keys in " +
                             uri() + " (first \"" + keys[start] + "\")";
    TIDAL_ASSIGN_OR_RETURN(
        http::Response response,
        Call(
            *client_, [&] { return s3::DeleteObjects(endpoint_, bucket_, batch); }, what, ""));
    auto failures = s3::ParseDeleteResult(response.body);
    if (!failures.ok()) return failures.status().WithContext("s3: " + what);
    if (failures->empty()) continue;
    const s3::DeleteFailure& first = failures->front();
    std::string message = "s3: " + what + ": " + std::to_string(failures->size()) +
                          " keys not deleted, first \"" + first.key + "\": " + first.code + ": " +
                          first.message;
    if (first.code == "AccessDenied") return FailedPrecondition(message);
    if (s3::IsRetryableAnswer(0, first.code)) return Unavailable(message);
    return Internal(message);
  }
  return OkStatus();
}

}  // namespace tidal::objstore
