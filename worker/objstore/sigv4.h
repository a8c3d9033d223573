// worker/objstore/sigv4.h — AWS Signature Version 4 (AWS4-HMAC-SHA256) for the
// Authorization header, as pure functions of the request, the credentials and the time
// (STYLE.md rule 1): tested against the AWS signing test suite and against botocore.
// Reference:
// https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html
//
// The one place where S3 differs from every other service is the canonical URI: other
// services normalise the path (remove "." / ".." segments and duplicate '/') and percent-encode
// the already-encoded path a second time; S3 does neither and signs the path exactly as it
// is sent (botocore's S3SigV4Auth, aws-c-auth's `should_normalize_uri_path = false,
// use_double_uri_encode = false` for S3). Query signing (presigned URLs), chunked/streaming
// payload signing and SigV4a are not implemented: the object store never uses them.
// Depends on OpenSSL's libcrypto (SHA-256, HMAC) only.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tidal::objstore::sigv4 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // "" unless temporary credentials; sent as X-Amz-Security-Token
};

// How the canonical URI is built from the path as sent.
struct UriRules {
  bool normalize_path = true;      // remove "." and ".." segments and empty segments
  bool double_encode_path = true;  // percent-encode the (already encoded) path once more
};
inline constexpr UriRules kS3UriRules{false, false};
inline constexpr UriRules kDefaultUriRules{true, true};

// A request as it will go on the wire.
struct Request {
  std::string method;  // "GET"
  std::string path;    // exactly as sent, already percent-encoded: "/bucket/my%20key"
  std::string query;   // exactly as sent, without the '?': "list-type=2&prefix=a%2Fb"
  // Every header to sign, Host included, in the order sent; names in any case, duplicates
  // allowed (their values are joined with ',').
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // lowercase hex SHA-256 of the body
};

struct SigningParams {
  Credentials credentials;
  std::string region;   // "us-east-1"
  std::string service;  // "s3"
  std::chrono::sys_seconds time;
  UriRules uri_rules = kS3UriRules;
  // Add and sign x-amz-content-sha256 (S3 requires it; it must be the real payload hash,
  // never UNSIGNED-PAYLOAD, so S3 checks the body end to end).
  bool add_content_sha256 = true;
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;  // lowercase hex
  // Headers to add to the request, in this order: X-Amz-Date, X-Amz-Security-Token (with a
  // session token), x-amz-content-sha256 (when asked), Authorization.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Signs `request` as SigV4 header authentication: the added X-Amz-* headers are part of what
// is signed.
Signature Sign(const Request& request, const SigningParams& params);

// The steps, exposed for tests and for diagnosing a SignatureDoesNotMatch.
std::string AmzDate(std::chrono::sys_seconds time);  // "20150830T123600Z"
// RFC 3986 percent-encoding as SigV4 wants it: every byte but A-Z a-z 0-9 - . _ ~ (and '/'
// when `keep_slash`) becomes %XX with uppercase hex.
std::string UriEncode(std::string_view s, bool keep_slash);
std::string CanonicalUri(std::string_view path, const UriRules& rules);
// Each name and value decoded and re-encoded with UriEncode, sorted by name then value, a
// missing '=' signed as an empty value.
std::string CanonicalQueryString(std::string_view query);
struct CanonicalHeaderList {
  std::string canonical;       // "host:example.com\nx-amz-date:...\n" (each line ends in '\n')
  std::string signed_headers;  // "host;x-amz-date"
};
// Names lowercased; values trimmed with runs of spaces and tabs collapsed to one space.
CanonicalHeaderList CanonicalHeaders(const std::vector<std::pair<std::string, std::string>>& h);
std::string CanonicalRequest(const Request& request, const UriRules& rules);
std::string CredentialScope(std::chrono::sys_seconds time, std::string_view region,
                            std::string_view service);
std::string StringToSign(std::chrono::sys_seconds time, std::string_view scope,
                         std::string_view canonical_request);
// The derived key (raw bytes): HMAC chain over date, region, service, "aws4_request".
std::string SigningKey(std::string_view secret_access_key, std::chrono::sys_seconds time,
                       std::string_view region, std::string_view service);

std::string Sha256Hex(std::string_view data);
std::string HmacSha256(std::string_view key, std::string_view data);  // raw bytes
std::string Hex(std::string_view bytes);

}  // namespace tidal::objstore::sigv4
