// worker/objstore/sigv4.cc
#include "worker/objstore/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "common/http/message.h"
#include "common/strings.h"

namespace tidal::objstore::sigv4 {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding that keeps a malformed escape as it is and '+' as '+' (SigV4 reads the
// query as RFC 3986, not as an HTML form).
std::string Decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Trim, and collapse every run of spaces and tabs into one space ("Trimall").
std::string TrimAll(std::string_view value) {
  std::string out;
  bool in_space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      in_space = true;
      continue;
    }
    if (in_space && !out.empty()) out.push_back(' ');
    in_space = false;
    out.push_back(c);
  }
  return out;
}

// RFC 3986 §5.2.4 remove_dot_segments, plus collapsing of empty segments ("//").
std::string NormalizePath(std::string_view path) {
  std::vector<std::string_view> segments;
  bool trailing_slash = false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string_view segment = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    bool last = slash == std::string_view::npos;
    if (segment == "..") {
      if (!segments.empty()) segments.pop_back();
      trailing_slash = last;
    } else if (segment == "." || segment.empty()) {
      trailing_slash = last;
    } else {
      segments.push_back(segment);
      trailing_slash = false;
    }
    if (last) break;
    start = slash + 1;
  }
  std::string out;
  for (std::string_view s : segments) {
    out.push_back('/');
    out.append(s);
  }
  if (out.empty() || trailing_slash) out.push_back('/');
  return out;
}

std::string DateStamp(std::chrono::sys_seconds time) { return AmzDate(time).substr(0, 8); }

}  // namespace

std::string Hex(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(std::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string AmzDate(std::chrono::sys_seconds time) {
  using namespace std::chrono;
  const sys_days day = floor<days>(time);
  const year_month_day ymd(day);
  const hh_mm_ss<seconds> hms(time - day);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04d%02u%02uT%02d%02d%02dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(hms.hours().count()), static_cast<int>(hms.minutes().count()),
                static_cast<int>(hms.seconds().count()));
  return buf;
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  return http::PercentEncode(s, keep_slash);
}

std::string CanonicalUri(std::string_view path, const UriRules& rules) {
  if (path.empty()) return "/";
  std::string out = rules.normalize_path ? NormalizePath(path) : std::string(path);
  if (rules.double_encode_path) out = UriEncode(out, true);
  return out;
}

std::string CanonicalQueryString(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t start = 0;
  while (start <= query.size() && !query.empty()) {
    size_t amp = query.find('&', start);
    std::string_view pair =
        query.substr(start, amp == std::string_view::npos ? std::string_view::npos : amp - start);
    if (!pair.empty()) {
      size_t eq = pair.find('=');
      std::string_view name = pair.substr(0, eq);
      std::string_view value = eq == std::string_view::npos ? "" : pair.substr(eq + 1);
      pairs.emplace_back(UriEncode(Decode(name), false), UriEncode(Decode(value), false));
    }
    if (amp == std::string_view::npos) break;
    start = amp + 1;
  }
  std::sort(pairs.begin(), pairs.end());
  std::string out;
  for (const auto& [name, value] : pairs) {
    if (!out.empty()) out.push_back('&');
    out += name + "=" + value;
  }
  return out;
}

CanonicalHeaderList CanonicalHeaders(
    const std::vector<std::pair<std::string, std::string>>& headers) {
  std::map<std::string, std::string> joined;  // sorted by lowercase name
  for (const auto& [name, value] : headers) {
    std::string key = AsciiLower(TrimAll(name));
    auto [it, inserted] = joined.try_emplace(key, TrimAll(value));
    if (!inserted) it->second += "," + TrimAll(value);
  }
  CanonicalHeaderList out;
  for (const auto& [name, value] : joined) {
    out.canonical += name + ":" + value + "\n";
    if (!out.signed_headers.empty()) out.signed_headers.push_back(';');
    out.signed_headers += name;
  }
  return out;
}

std::string CanonicalRequest(const Request& request, const UriRules& rules) {
  CanonicalHeaderList headers = CanonicalHeaders(request.headers);
  return request.method + "\n" + CanonicalUri(request.path, rules) + "\n" +
         CanonicalQueryString(request.query) + "\n" + headers.canonical + "\n" +
         headers.signed_headers + "\n" + request.payload_sha256;
}

std::string CredentialScope(std::chrono::sys_seconds time, std::string_view region,
                            std::string_view service) {
  return DateStamp(time) + "/" + std::string(region) + "/" + std::string(service) + "/aws4_request";
}

std::string StringToSign(std::chrono::sys_seconds time, std::string_view scope,
                         std::string_view canonical_request) {
  return std::string(kAlgorithm) + "\n" + AmzDate(time) + "\n" + std::string(scope) + "\n" +
         Sha256Hex(canonical_request);
}

std::string SigningKey(std::string_view secret_access_key, std::chrono::sys_seconds time,
                       std::string_view region, std::string_view service) {
  std::string key = HmacSha256("AWS4" + std::string(secret_access_key), DateStamp(time));
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  return HmacSha256(key, "aws4_request");
}

Signature Sign(const Request& request, const SigningParams& params) {
  Signature out;
  out.headers.emplace_back("X-Amz-Date", AmzDate(params.time));
  if (!params.credentials.session_token.empty())
    out.headers.emplace_back("X-Amz-Security-Token", params.credentials.session_token);
  if (params.add_content_sha256)
    out.headers.emplace_back("x-amz-content-sha256", request.payload_sha256);

  Request signed_request = request;
  signed_request.headers.insert(signed_request.headers.end(), out.headers.begin(),
                                out.headers.end());
  out.canonical_request = CanonicalRequest(signed_request, params.uri_rules);
  const std::string scope = CredentialScope(params.time, params.region, params.service);
  out.string_to_sign = StringToSign(params.time, scope, out.canonical_request);
  out.signature = Hex(HmacSha256(
      SigningKey(params.credentials.secret_access_key, params.time, params.region, params.service),
      out.string_to_sign));
  out.headers.emplace_back(
      "Authorization",
      std::string(kAlgorithm) + " Credential=" + params.credentials.access_key_id + "/" + scope +
          ", SignedHeaders=" + CanonicalHeaders(signed_request.headers).signed_headers +
          ", Signature=" + out.signature);
  return out;
}

}  // namespace tidal::objstore::sigv4
