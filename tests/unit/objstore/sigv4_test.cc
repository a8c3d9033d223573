// The SigV4 signer against the AWS signing test suite (tests/fixtures/sigv4, from aws-c-auth)
// and against the documented rules where S3 differs from other services.
#include "worker/objstore/sigv4.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tidal::objstore::sigv4 {
namespace {

using namespace std::chrono;

const std::string kFixtures = std::string(TIDAL_SOURCE_DIR) + "/tests/fixtures/sigv4";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures, ec))
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// request.txt: "METHOD path[?query] HTTP/1.1", "Name:value" lines, then an optional blank
// line and the body. The path may hold spaces ("/example space/"), so the version is cut off
// the end of the line.
Request ParseRequestFile(const std::string& text, std::string& body) {
  Request request;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  request.method = line.substr(0, line.find(' '));
  std::string target = line.substr(request.method.size() + 1);
  target = target.substr(0, target.rfind(" HTTP/"));
  size_t q = target.find('?');
  request.path = target.substr(0, q);
  request.query = q == std::string::npos ? "" : target.substr(q + 1);
  while (std::getline(in, line) && !line.empty()) {
    size_t colon = line.find(':');
    request.headers.emplace_back(line.substr(0, colon), line.substr(colon + 1));
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  body = rest.str();
  return request;
}

std::string AuthorizationLine(const std::string& signed_request) {
  std::istringstream in(signed_request);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Authorization:", 0) == 0) return line.substr(14);
  return "";
}

sys_seconds ParseIsoTime(const std::string& text) {  // "2015-08-30T12:36:00Z"
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  EXPECT_FALSE(in.fail()) << text;
  return sys_days(year(tm.tm_year + 1900) / (tm.tm_mon + 1) / tm.tm_mday) + hours(tm.tm_hour) +
         minutes(tm.tm_min) + seconds(tm.tm_sec);
}

class AwsSigningSuite : public ::testing::TestWithParam<std::string> {};

TEST(AwsSigningSuiteFixtures, AllCopiedCasesArePresent) {
  // 38 SigV4 cases upstream, 2 left out (see tests/fixtures/sigv4/README.md).
  EXPECT_EQ(CaseNames().size(), 36u);
}

TEST_P(AwsSigningSuite, CanonicalRequestStringToSignAndSignatureMatch) {
  const std::string dir = kFixtures + "/" + GetParam();
  const auto context = nlohmann::json::parse(ReadFile(dir + "/context.json"));
  std::string body;
  Request request = ParseRequestFile(ReadFile(dir + "/request.txt"), body);
  request.payload_sha256 = Sha256Hex(body);

  SigningParams params;
  params.credentials.access_key_id = context["credentials"]["access_key_id"];
  params.credentials.secret_access_key = context["credentials"]["secret_access_key"];
  params.credentials.session_token = context["credentials"].value("token", "");
  params.region = context["region"];
  params.service = context["service"];
  params.time = ParseIsoTime(context["timestamp"]);
  // The suite signs as a non-S3 service: the path is encoded a second time, and normalised
  // unless the case says not to.
  params.uri_rules = UriRules{context["normalize"].get<bool>(), true};
  params.add_content_sha256 = context["sign_body"].get<bool>();

  Signature signature = Sign(request, params);
  EXPECT_EQ(signature.canonical_request, ReadFile(dir + "/header-canonical-request.txt"));
  EXPECT_EQ(signature.string_to_sign, ReadFile(dir + "/header-string-to-sign.txt"));
  EXPECT_EQ(signature.signature, ReadFile(dir + "/header-signature.txt"));
  ASSERT_FALSE(signature.headers.empty());
  EXPECT_EQ(signature.headers.back().first, "Authorization");
  EXPECT_EQ(signature.headers.back().second,
            AuthorizationLine(ReadFile(dir + "/header-signed-request.txt")));
}

INSTANTIATE_TEST_SUITE_P(Cases, AwsSigningSuite, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Sigv4, SigningKeyMatchesTheAwsDocumentationExample) {
  // AWS General Reference, "Examples of how to derive a signing key for Signature Version 4".
  sys_seconds time = sys_days(2012y / February / 15);
  EXPECT_EQ(Hex(SigningKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", time, "us-east-1", "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(Sigv4, AmzDateIsBasicIso8601InUtc) {
  EXPECT_EQ(AmzDate(sys_days(2015y / August / 30) + 12h + 36min), "20150830T123600Z");
  EXPECT_EQ(AmzDate(sys_days(2024y / January / 2) + 3h + 4min + 5s), "20240102T030405Z");
  EXPECT_EQ(CredentialScope(sys_days(2024y / January / 2), "eu-west-1", "s3"),
            "20240102/eu-west-1/s3/aws4_request");
}

TEST(Sigv4, S3SignsThePathAsSentWithoutNormalisingOrEncodingAgain) {
  const std::string path = "/bucket/a%20b/./c//d/../e%2Bf~";
  EXPECT_EQ(CanonicalUri(path, kS3UriRules), path);
  // Other services normalise, then encode the encoded path once more.
  EXPECT_EQ(CanonicalUri(path, kDefaultUriRules), "/bucket/a%2520b/c/e%252Bf~");
  EXPECT_EQ(CanonicalUri("", kS3UriRules), "/");
}

TEST(Sigv4, CanonicalQueryStringSortsAndEncodesStrictly) {
  // Sorted by encoded name, then value; '+' is a literal plus (not a space); lowercase hex is
  // re-encoded uppercase; a name without '=' signs an empty value.
  EXPECT_EQ(CanonicalQueryString("prefix=a%2fb+c&list-type=2&uploads&b=2&b=1"),
            "b=1&b=2&list-type=2&prefix=a%2Fb%2Bc&uploads=");
  EXPECT_EQ(CanonicalQueryString("continuation-token=1%2F2%3D%3D&x=%7E"),
            "continuation-token=1%2F2%3D%3D&x=~");
  EXPECT_EQ(CanonicalQueryString(""), "");
}

TEST(Sigv4, CanonicalHeadersLowercaseTrimCollapseAndJoinDuplicates) {
  CanonicalHeaderList headers = CanonicalHeaders(
      {{"Host", "example.com"}, {"X-Amz-Meta-A", "  one   two\t three "}, {"x-amz-meta-a", "2"}});
  EXPECT_EQ(headers.canonical, "host:example.com\nx-amz-meta-a:one two three,2\n");
  EXPECT_EQ(headers.signed_headers, "host;x-amz-meta-a");
}

TEST(Sigv4, S3SigningAddsTheRealPayloadHashAndTheSessionToken) {
  Request request;
  request.method = "PUT";
  request.path = "/bucket/key";
  request.headers = {{"Host", "127.0.0.1:9000"}};
  request.payload_sha256 = Sha256Hex("payload");
  SigningParams params;
  params.credentials = {"AKID", "SECRET", "TOKEN"};
  params.region = "us-east-1";
  params.service = "s3";
  params.time = sys_days(2024y / May / 17);
  Signature signature = Sign(request, params);
  ASSERT_EQ(signature.headers.size(), 4u);
  EXPECT_EQ(signature.headers[0],
            std::make_pair(std::string("X-Amz-Date"), std::string("20240517T000000Z")));
  EXPECT_EQ(signature.headers[1],
            std::make_pair(std::string("X-Amz-Security-Token"), std::string("TOKEN")));
  EXPECT_EQ(signature.headers[2].second, Sha256Hex("payload"));
  EXPECT_NE(signature.headers[2].second, "UNSIGNED-PAYLOAD");
  EXPECT_NE(
      signature.canonical_request.find(
          "host;x-amz-content-sha256;x-amz-date;x-amz-security-token\n" + Sha256Hex("payload")),
      std::string::npos)
      << signature.canonical_request;
  EXPECT_EQ(signature.headers[3].second.rfind(
                "AWS4-HMAC-SHA256 Credential=AKID/20240517/us-east-1/s3/aws4_request, "
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, "
                "Signature=",
                0),
            0u)
      << signature.headers[3].second;
}

}  // namespace
}  // namespace tidal::objstore::sigv4
