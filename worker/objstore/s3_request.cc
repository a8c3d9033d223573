// worker/objstore/s3_request.cc
#include "worker/objstore/s3_request.h"

#include <openssl/evp.h>

#include <charconv>
#include <ctime>

#include "common/base64.h"
#include "worker/objstore/s3_retry.h"
#include "worker/objstore/s3_xml.h"

namespace tidal::objstore::s3 {
namespace {

// A query parameter; `bare` ones go on the wire without '=' ("?uploads", "?delete"), which
// SigV4 signs as an empty value.
struct Param {
  std::string name;
  std::string value;
  bool bare = false;
};

std::string Path(const Endpoint& e, std::string_view bucket, std::string_view key) {
  std::string path = e.path_style ? "/" + std::string(bucket) : "";
  if (!key.empty() || !e.path_style) path += "/" + EncodeKey(key);
  return path;
}

http::Request Build(const Endpoint& e, std::string method, std::string_view bucket,
                    std::string_view key, const std::vector<Param>& query, std::string body = "") {
  http::Request request;
  request.method = std::move(method);
  request.target = Path(e, bucket, key);
  char sep = '?';
  for (const Param& p : query) {
    request.target += sep + sigv4::UriEncode(p.name, false);
    if (!p.bare) request.target += "=" + sigv4::UriEncode(p.value, false);
    sep = '&';
  }
  request.headers.Set("Host", HostHeader(BucketOrigin(e, bucket)));
  request.body = std::move(body);
  return request;
}

bool ParseUint(std::string_view text, uint64_t& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

bool IsCredentialError(std::string_view code) {
  return code == "AccessDenied" || code == "InvalidAccessKeyId" ||
         code == "SignatureDoesNotMatch" || code == "ExpiredToken" || code == "InvalidToken" ||
         code == "TokenRefreshRequired" || code == "RequestTimeTooSkewed" ||
         code == "AccountProblem" || code == "AllAccessDisabled";
}

}  // namespace

http::Origin BucketOrigin(const Endpoint& endpoint, std::string_view bucket) {
  http::Origin origin = endpoint.origin;
  if (!endpoint.path_style) origin.host = std::string(bucket) + "." + origin.host;
  return origin;
}

std::string HostHeader(const http::Origin& o) {
  // As http::Client::Prepare writes it.
  bool default_port =
      (o.scheme == "https" && o.port == 443) || (o.scheme == "http" && o.port == 80);
  std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  return default_port ? host : host + ":" + std::to_string(o.port);
}

std::string EncodeKey(std::string_view key) { return sigv4::UriEncode(key, true); }

std::string MultipartEtag(const std::vector<std::string>& part_etags) {
  std::string digests;
  for (std::string_view etag : part_etags) {
    if (etag.size() != 34 || etag.front() != '"' || etag.back() != '"') return "";
    for (size_t i = 1; i < 33; i += 2) {
      auto nibble = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      };
      const int hi = nibble(etag[i]), lo = nibble(etag[i + 1]);
      if (hi < 0 || lo < 0) return "";
      digests.push_back(static_cast<char>(hi * 16 + lo));
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(digests.data(), digests.size(), digest, &len, EVP_md5(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out + "-" + std::to_string(part_etags.size()) + "\"";
}

std::string ContentMd5(std::string_view body) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(body.data(), body.size(), digest, &len, EVP_md5(), nullptr);
  return Base64Encode(std::string(reinterpret_cast<const char*>(digest), len));
}

http::Request PutObject(const Endpoint& e, std::string_view bucket, std::string_view key,
                        std::string body) {
  http::Request request = Build(e, "PUT", bucket, key, {}, std::move(body));
  request.headers.Set("Content-MD5", ContentMd5(request.body));
  return request;
}

http::Request GetObject(const Endpoint& e, std::string_view bucket, std::string_view key,
                        std::optional<ByteRange> range) {
  http::Request request = Build(e, "GET", bucket, key, {});
  if (range)
    request.headers.Set(
        "Range", "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last));
  return request;
}

http::Request HeadObject(const Endpoint& e, std::string_view bucket, std::string_view key) {
  return Build(e, "HEAD", bucket, key, {});
}

http::Request ListObjectsV2(const Endpoint& e, std::string_view bucket, std::string_view prefix,
                            std::string_view continuation_token, int max_keys) {
  std::vector<Param> query;
  if (!continuation_token.empty())
    query.push_back({"continuation-token", std::string(continuation_token)});
  query.push_back({"list-type", "2"});
  if (max_keys > 0) query.push_back({"max-keys", std::to_string(max_keys)});
  if (!prefix.empty()) query.push_back({"prefix", std::string(prefix)});
  return Build(e, "GET", bucket, "", query);
}

http::Request DeleteObjects(const Endpoint& e, std::string_view bucket,
                            const std::vector<std::string>& keys) {
  std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Delete><Quiet>true</Quiet>";
  for (const std::string& key : keys) body += "<Object><Key>" + XmlEscape(key) + "</Key></Object>";
  body += "</Delete>";
  http::Request request = Build(e, "POST", bucket, "", {{"delete", "", true}}, std::move(body));
  // S3 refuses a multi-object delete without a checksum of its body.
  request.headers.Set("Content-MD5", ContentMd5(request.body));
  request.headers.Set("Content-Type", "application/xml");
  return request;
}

http::Request CreateMultipartUpload(const Endpoint& e, std::string_view bucket,
                                    std::string_view key) {
  return Build(e, "POST", bucket, key, {{"uploads", "", true}});
}

http::Request UploadPart(const Endpoint& e, std::string_view bucket, std::string_view key,
                         std::string_view upload_id, int part_number, std::string body) {
  http::Request request =
      Build(e, "PUT", bucket, key,
            {{"partNumber", std::to_string(part_number)}, {"uploadId", std::string(upload_id)}},
            std::move(body));
  request.headers.Set("Content-MD5", ContentMd5(request.body));
  return request;
}

http::Request CompleteMultipartUpload(const Endpoint& e, std::string_view bucket,
                                      std::string_view key, std::string_view upload_id,
                                      const std::vector<CompletedPart>& parts) {
  std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUpload>";
  for (const CompletedPart& part : parts)
    body += "<Part><PartNumber>" + std::to_string(part.number) + "</PartNumber><ETag>" +
            XmlEscape(part.etag) + "</ETag></Part>";
  body += "</CompleteMultipartUpload>";
  http::Request request =
      Build(e, "POST", bucket, key, {{"uploadId", std::string(upload_id)}}, std::move(body));
  request.headers.Set("Content-Type", "application/xml");
  return request;
}

http::Request AbortMultipartUpload(const Endpoint& e, std::string_view bucket, std::string_view key,
                                   std::string_view upload_id) {
  return Build(e, "DELETE", bucket, key, {{"uploadId", std::string(upload_id)}});
}

void Sign(http::Request& request, const sigv4::Credentials& credentials, std::string_view region,
          std::chrono::sys_seconds now) {
  sigv4::Request signable;
  signable.method = request.method;
  size_t q = request.target.find('?');
  signable.path = request.target.substr(0, q);
  signable.query = q == std::string::npos ? "" : request.target.substr(q + 1);
  // A request signed before (a retry) keeps its headers but not its old signature.
  for (const auto& [name, value] : request.headers.entries())
    if (name != "authorization" && name != "x-amz-date" && name != "x-amz-content-sha256" &&
        name != "x-amz-security-token")
      signable.headers.emplace_back(name, value);
  signable.payload_sha256 = sigv4::Sha256Hex(request.body);
  sigv4::SigningParams params;
  params.credentials = credentials;
  params.region = std::string(region);
  params.service = "s3";
  params.time = now;
  params.uri_rules = sigv4::kS3UriRules;
  params.add_content_sha256 = true;
  for (auto& [name, value] : sigv4::Sign(signable, params).headers)
    request.headers.Set(name, value);
}

std::optional<ContentRange> ParseContentRange(std::string_view value) {
  constexpr std::string_view kUnit = "bytes ";
  if (value.substr(0, kUnit.size()) != kUnit) return std::nullopt;
  value.remove_prefix(kUnit.size());
  size_t dash = value.find('-');
  size_t slash = value.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash)
    return std::nullopt;
  ContentRange range;
  if (!ParseUint(value.substr(0, dash), range.first) ||
      !ParseUint(value.substr(dash + 1, slash - dash - 1), range.last) || range.last < range.first)
    return std::nullopt;
  std::string_view total = value.substr(slash + 1);
  if (total != "*") {
    uint64_t n = 0;
    if (!ParseUint(total, n)) return std::nullopt;
    range.total = n;
  }
  return range;
}

namespace {

std::optional<std::chrono::system_clock::time_point> ParseUtc(const std::string& text,
                                                              const char* format) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), format, &tm);
  if (!end) return std::nullopt;
  if (*end == '.') {  // a fraction of a second: ignored
    ++end;
    while (*end >= '0' && *end <= '9') ++end;
  }
  const std::string rest(end);
  if (rest != "Z" && rest != " GMT" && rest != "") return std::nullopt;
  const std::time_t t = timegm(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t);
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> ServerTime(const http::Response& response) {
  const std::string_view body = response.body;
  const auto open = body.find("<ServerTime>"), close = body.find("</ServerTime>");
  if (open != std::string_view::npos && close != std::string_view::npos && close > open) {
    const std::string text(body.substr(open + 12, close - open - 12));
    if (auto t = ParseUtc(text, "%Y-%m-%dT%H:%M:%S")) return t;
  }
  if (auto date = response.headers.Get("Date"))
    if (auto t = ParseUtc(*date, "%a, %d %b %Y %H:%M:%S")) return t;
  return std::nullopt;
}

std::string ErrorCode(std::string_view body) {
  if (body.empty()) return "";
  auto error = ParseError(body);
  return error.ok() ? error->code : "";
}

Status ErrorStatus(std::string_view what, int http_status, std::string_view body,
                   std::string_view bucket, std::string_view key) {
  ErrorBody error;
  if (!body.empty()) {
    if (auto parsed = ParseError(body); parsed.ok()) {
      error = *parsed;
    } else {
      // Not S3's XML (a proxy's or load balancer's page): quote its start.
      error.message = std::string(body.substr(0, 200));
    }
  }
  std::string detail = "HTTP " + std::to_string(http_status);
  if (!error.code.empty()) detail += " " + error.code;
  if (!error.message.empty()) detail += ": " + error.message;
  const std::string prefix = "s3: " + std::string(what) + ": ";
  const std::string_view code = error.code;

  if (code == "NoSuchBucket")
    return NotFound(prefix + "bucket \"" + std::string(bucket) + "\" does not exist (" + detail +
                    ")");
  if (code == "NoSuchKey" || (http_status == 404 && code.empty() && !key.empty()))
    return NotFound(prefix + "key \"" + std::string(key) + "\" not found (" + detail + ")");
  if (code == "NoSuchUpload") return NotFound(prefix + detail);
  if (http_status == 403 || IsCredentialError(code))
    return FailedPrecondition(prefix + detail +
                              " (check the access key, secret, session token, the bucket's "
                              "policy and the clock)");
  // A bucket in another region than the one signed for, or reached through the wrong endpoint.
  if (http_status == 301 || http_status == 307 || code == "PermanentRedirect" ||
      code == "TemporaryRedirect" || code == "AuthorizationHeaderMalformed" ||
      code == "IllegalLocationConstraintException")
    return FailedPrecondition(prefix + detail + " (check the region and the endpoint)");
  if (code == "BadDigest" || code == "XAmzContentSHA256Mismatch" || code == "InvalidDigest")
    return DataLoss(prefix + detail);
  if (code == "InvalidRange" || http_status == 416) return InvalidArgument(prefix + detail);
  if (IsRetryableAnswer(http_status, code)) return Unavailable(prefix + detail);
  if (http_status == 409) return Aborted(prefix + detail);
  if (http_status == 405 || http_status == 501 || code == "NotImplemented" ||
      code == "MethodNotAllowed")
    return FailedPrecondition(prefix + detail + " (the endpoint does not support this request)");
  if (http_status >= 400 && http_status < 500) return InvalidArgument(prefix + detail);
  return Internal(prefix + detail);
}

}  // namespace tidal::objstore::s3
