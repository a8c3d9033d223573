// S3 request builders, signing of what they build, Content-Range parsing and the mapping of
// S3 error answers to a Status — all without a server.
#include "worker/objstore/s3_request.h"

#include <gtest/gtest.h>

#include "common/base64.h"

namespace tidal::objstore::s3 {
namespace {

using namespace std::chrono;

Endpoint PathStyle() { return Endpoint{{"http", "127.0.0.1", 9000}, true}; }
Endpoint VirtualHosted() { return Endpoint{{"https", "s3.eu-west-1.amazonaws.com", 443}, false}; }

TEST(S3Request, PathStyleAndVirtualHostedAddressing) {
  http::Request path = GetObject(PathStyle(), "ckpt", "step-1/a b+c~ü.json");
  EXPECT_EQ(path.method, "GET");
  EXPECT_EQ(path.target, "/ckpt/step-1/a%20b%2Bc~%C3%BC.json");
  EXPECT_EQ(path.headers.Get("host"), "127.0.0.1:9000");

  http::Request vhost = GetObject(VirtualHosted(), "ckpt", "step-1/x");
  EXPECT_EQ(vhost.target, "/step-1/x");
  EXPECT_EQ(vhost.headers.Get("host"), "ckpt.s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(BucketOrigin(VirtualHosted(), "ckpt").host, "ckpt.s3.eu-west-1.amazonaws.com");

  // Bucket-level requests: "/bucket" path-style, "/" virtual-hosted.
  EXPECT_EQ(ListObjectsV2(PathStyle(), "ckpt", "", "", 0).target, "/ckpt?list-type=2");
  EXPECT_EQ(ListObjectsV2(VirtualHosted(), "ckpt", "", "", 0).target, "/?list-type=2");
}

TEST(S3Request, HostHeaderOmitsTheDefaultPortAndBracketsIpv6) {
  EXPECT_EQ(HostHeader({"https", "s3.amazonaws.com", 443}), "s3.amazonaws.com");
  EXPECT_EQ(HostHeader({"http", "s3.amazonaws.com", 443}), "s3.amazonaws.com:443");
  EXPECT_EQ(HostHeader({"http", "::1", 9000}), "[::1]:9000");
}

TEST(S3Request, ListQueryEncodesPrefixAndContinuationTokenStrictly) {
  // s3rver's and S3's tokens are base64: '+', '/' and '=' must be encoded, or '+' arrives as
  // a space.
  http::Request request = ListObjectsV2(PathStyle(), "ckpt", "run 1/step+", "1A+b/c==", 250);
  EXPECT_EQ(request.target,
            "/ckpt?continuation-token=1A%2Bb%2Fc%3D%3D&list-type=2&max-keys=250&prefix=run%201%2F"
            "step%2B");
  EXPECT_TRUE(request.body.empty());
}

TEST(S3Request, PutAndUploadPartCarryContentMd5OfTheBody) {
  http::Request put = PutObject(PathStyle(), "ckpt", "k", "hello world");
  EXPECT_EQ(put.method, "PUT");
  EXPECT_EQ(put.body, "hello world");
  EXPECT_EQ(put.headers.Get("content-md5"), "XrY7u+Ae7tCTyyK7j1rNww==");
  EXPECT_EQ(ContentMd5(""), "1B2M2Y8AsgTpgAmY7PhCfg==");

  http::Request part = UploadPart(PathStyle(), "ckpt", "k", "up/1=", 3, "hello world");
  EXPECT_EQ(part.target, "/ckpt/k?partNumber=3&uploadId=up%2F1%3D");
  EXPECT_EQ(part.headers.Get("content-md5"), "XrY7u+Ae7tCTyyK7j1rNww==");
}

TEST(S3Request, RangedGetAsksForInclusiveBytes) {
  http::Request request = GetObject(PathStyle(), "ckpt", "k", ByteRange{10, 19});
  EXPECT_EQ(request.headers.Get("range"), "bytes=10-19");
  EXPECT_FALSE(GetObject(PathStyle(), "ckpt", "k").headers.Has("range"));
}

TEST(S3Request, DeleteObjectsPostsEscapedXmlWithContentMd5) {
  http::Request request = DeleteObjects(PathStyle(), "ckpt", {"a&b", "c<d>\"'"});
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.target, "/ckpt?delete");
  EXPECT_EQ(request.body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Delete><Quiet>true</Quiet>"
            "<Object><Key>a&amp;b</Key></Object>"
            "<Object><Key>c&lt;d&gt;&quot;&apos;</Key></Object></Delete>");
  EXPECT_EQ(request.headers.Get("content-md5"), ContentMd5(request.body));
}

TEST(S3Request, MultipartUploadRequests) {
  EXPECT_EQ(CreateMultipartUpload(PathStyle(), "ckpt", "big").target, "/ckpt/big?uploads");
  EXPECT_EQ(CreateMultipartUpload(PathStyle(), "ckpt", "big").method, "POST");
  http::Request complete =
      CompleteMultipartUpload(PathStyle(), "ckpt", "big", "id1", {{1, "\"e1\""}, {2, "\"e2\""}});
  EXPECT_EQ(complete.method, "POST");
  EXPECT_EQ(complete.target, "/ckpt/big?uploadId=id1");
  EXPECT_EQ(complete.body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUpload>"
            "<Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part>"
            "</CompleteMultipartUpload>");
  http::Request abort = AbortMultipartUpload(PathStyle(), "ckpt", "big", "id1");
  EXPECT_EQ(abort.method, "DELETE");
  EXPECT_EQ(abort.target, "/ckpt/big?uploadId=id1");
}

TEST(S3Request, SigningAddsSignedHeadersWithThePayloadHash) {
  http::Request request = PutObject(PathStyle(), "ckpt", "k", "data");
  Sign(request, {"AKID", "SECRET", ""}, "us-east-1", sys_days(2024y / May / 17) + 1h);
  EXPECT_EQ(request.headers.Get("x-amz-date"), "20240517T010000Z");
  EXPECT_EQ(request.headers.Get("x-amz-content-sha256"), sigv4::Sha256Hex("data"));
  EXPECT_FALSE(request.headers.Has("x-amz-security-token"));
  auto authorization = request.headers.Get("authorization");
  ASSERT_TRUE(authorization);
  EXPECT_NE(authorization->find("SignedHeaders=content-md5;host;x-amz-content-sha256;x-amz-date,"),
            std::string::npos)
      << *authorization;
  // Signing twice (a retry) replaces the headers instead of adding a second copy.
  Sign(request, {"AKID", "SECRET", ""}, "us-east-1", sys_days(2024y / May / 17) + 2h);
  int dates = 0;
  for (const auto& [name, value] : request.headers.entries()) dates += name == "x-amz-date";
  EXPECT_EQ(dates, 1);
  EXPECT_EQ(request.headers.Get("x-amz-date"), "20240517T020000Z");
}

TEST(S3Request, ParsesContentRange) {
  auto range = ParseContentRange("bytes 10-19/100");
  ASSERT_TRUE(range);
  EXPECT_EQ(range->first, 10u);
  EXPECT_EQ(range->last, 19u);
  EXPECT_EQ(range->total, 100u);
  auto unknown = ParseContentRange("bytes 0-0/*");
  ASSERT_TRUE(unknown);
  EXPECT_FALSE(unknown->total);
  EXPECT_FALSE(ParseContentRange("bytes */100"));
  EXPECT_FALSE(ParseContentRange("bytes 9-1/100"));
  EXPECT_FALSE(ParseContentRange("items 0-1/2"));
}

std::string ErrorXml(const std::string& code, const std::string& message,
                     const std::string& extra = "") {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code + "</Code><Message>" +
         message + "</Message>" + extra + "<RequestId>R1</RequestId></Error>";
}

TEST(S3ErrorStatus, NoSuchKeyIsNotFoundNamingTheKey) {
  Status s = ErrorStatus(
      "GET s3://ckpt/run/k", 404,
      ErrorXml("NoSuchKey", "The specified key does not exist.", "<Key>run/k</Key>"), "ckpt", "k");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("key \"k\" not found"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("NoSuchKey: The specified key does not exist."), std::string::npos);
  // HEAD answers have no body: a bare 404 still names the key.
  Status head = ErrorStatus("HEAD s3://ckpt/k", 404, "", "ckpt", "k");
  EXPECT_EQ(head.code(), StatusCode::kNotFound);
  EXPECT_NE(head.message().find("key \"k\" not found"), std::string::npos) << head.message();
}

TEST(S3ErrorStatus, NoSuchBucketIsNotFoundNamingTheBucket) {
  Status s = ErrorStatus("GET s3://gone/k", 404,
                         ErrorXml("NoSuchBucket", "The specified bucket does not exist",
                                  "<BucketName>gone</BucketName>"),
                         "gone", "k");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("bucket \"gone\" does not exist"), std::string::npos) << s.message();
}

// S3's ETag of a multipart object: the MD5 of the parts' binary MD5s, "-<parts>" (values from
// Python's hashlib for parts "part one" and "part two").
TEST(S3MultipartEtag, IsTheMd5OfThePartMd5sWithThePartCount) {
  EXPECT_EQ(MultipartEtag(
                {"\"3303e12af474ca11d85ed2966a932992\"", "\"3ea4e15b91a17dc76052c56cfcdf67a2\""}),
            "\"0732917abc3288784e318ac0aab1757a-2\"");
  EXPECT_EQ(MultipartEtag({"3303e12af474ca11d85ed2966a932992"}), "") << "unquoted";
  EXPECT_EQ(MultipartEtag({"\"3303e12af474ca11d85ed2966a93299Z\""}), "") << "not hex";
  EXPECT_EQ(MultipartEtag({"\"abc\""}), "") << "not an MD5";
}

TEST(S3ErrorStatus, ForbiddenIsATerminalFailedPreconditionWithCodeAndMessage) {
  for (const char* code : {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}) {
    Status s = ErrorStatus("PUT s3://ckpt/k", 403, ErrorXml(code, "Nope"), "ckpt", "k");
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << code;
    EXPECT_FALSE(s.retryable());
    EXPECT_NE(s.message().find("s3: PUT s3://ckpt/k: HTTP 403 " + std::string(code) + ": Nope"),
              std::string::npos)
        << s.message();
  }
}

TEST(S3ErrorStatus, WrongRegionIsAFailedPreconditionWithAHint) {
  Status s = ErrorStatus("GET s3://ckpt/k", 301,
                         ErrorXml("PermanentRedirect",
                                  "The bucket you are attempting to access must be addressed "
                                  "using the specified endpoint."),
                         "ckpt", "k");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 301 PermanentRedirect"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("check the region and the endpoint"), std::string::npos);
  EXPECT_EQ(ErrorStatus("PUT x", 400, ErrorXml("AuthorizationHeaderMalformed", "region"), "b", "k")
                .code(),
            StatusCode::kFailedPrecondition);
}

TEST(S3ErrorStatus, ThrottlingAndServerErrorsAreRetryable) {
  EXPECT_EQ(
      ErrorStatus("PUT x", 503, ErrorXml("SlowDown", "Reduce your request rate."), "b", "k").code(),
      StatusCode::kUnavailable);
  EXPECT_EQ(ErrorStatus("PUT x", 400, ErrorXml("RequestTimeout", "idle"), "b", "k").code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(ErrorStatus("PUT x", 502, "<html>Bad Gateway</html>", "b", "k").code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(ErrorStatus("PUT x", 400, ErrorXml("MalformedXML", "bad"), "b", "k").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorStatus("GET x", 416, ErrorXml("InvalidRange", "no"), "b", "k").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorStatus("PUT x", 400, ErrorXml("BadDigest", "md5"), "b", "k").code(),
            StatusCode::kDataLoss);
  Status unsupported = ErrorStatus("DELETE x", 405, ErrorXml("MethodNotAllowed", "no"), "b", "k");
  EXPECT_EQ(unsupported.code(), StatusCode::kFailedPrecondition);
  // A body that is not S3's XML is quoted, not lost.
  Status proxy = ErrorStatus("PUT x", 502, "<html>Bad Gateway</html>", "b", "k");
  EXPECT_NE(proxy.message().find("HTTP 502: <html>Bad Gateway</html>"), std::string::npos)
      << proxy.message();
  EXPECT_EQ(ErrorCode(ErrorXml("SlowDown", "x")), "SlowDown");
  EXPECT_EQ(ErrorCode("not xml"), "");
}

}  // namespace
}  // namespace tidal::objstore::s3
