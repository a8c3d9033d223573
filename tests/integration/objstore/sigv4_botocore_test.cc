// The SigV4 signatures of the requests the S3 store builds, compared with botocore's
// S3SigV4Auth (Debian python3-botocore) for the same requests at the same time: every kind of
// request the store sends, keys and query values that need encoding, a session token,
// path-style and virtual-hosted addressing.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"
#include "worker/objstore/s3_request.h"

namespace tidal::testing {
namespace {

using namespace std::chrono;
namespace s3 = objstore::s3;
namespace sigv4 = objstore::sigv4;

struct Case {
  std::string name;
  s3::Endpoint endpoint;
  std::string bucket;
  std::optional<std::string> key;  // nullopt: a bucket-level request
  http::Request request;           // unsigned
  sigv4::Credentials credentials;
  std::string region;
};

std::vector<Case> Cases() {
  const s3::Endpoint local{{"http", "127.0.0.1", 9000}, true};
  const s3::Endpoint aws{{"https", "s3.eu-west-1.amazonaws.com", 443}, false};
  const s3::Endpoint custom_tls{{"https", "minio.example.com", 9443}, true};
  const sigv4::Credentials keys{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  const sigv4::Credentials with_token{"ASIAEXAMPLE", "secret/with+chars=",
                                      "IQoJb3JpZ2luX2VjEP//////////wEaCXVzLWVhc3QtMSJH+token=="};
  const std::string odd_key = "run 1/odd names/a b+c~d ü €%.bin";
  const std::string binary("\0\x01\x02\xff payload", 12);
  const std::vector<s3::CompletedPart> parts = {{1, "\"5d41402abc4b2a76b9719d911017c592\""},
                                                {2, "\"7d793037a0760186574b0282f2f435e7\""}};
  return {
      {"put-with-body", local, "ckpt", "run/step-1/shard.bin",
       s3::PutObject(local, "ckpt", "run/step-1/shard.bin", binary), keys, "us-east-1"},
      {"put-empty", local, "ckpt", "run/latest", s3::PutObject(local, "ckpt", "run/latest", ""),
       keys, "us-east-1"},
      {"put-odd-key-with-session-token", local, "ckpt", odd_key,
       s3::PutObject(local, "ckpt", odd_key, "x"), with_token, "us-east-1"},
      {"get", local, "ckpt", odd_key, s3::GetObject(local, "ckpt", odd_key), keys, "us-east-1"},
      {"get-range", local, "ckpt", "run/step-1/shard.bin",
       s3::GetObject(local, "ckpt", "run/step-1/shard.bin", s3::ByteRange{1024, 2047}), keys,
       "us-east-1"},
      {"head", local, "ckpt", "run/step-1/shard.bin",
       s3::HeadObject(local, "ckpt", "run/step-1/shard.bin"), keys, "us-east-1"},
      {"list-first-page", local, "ckpt", std::nullopt,
       s3::ListObjectsV2(local, "ckpt", "run 1/step+ü", "", 1000), keys, "us-east-1"},
      {"list-continued", local, "ckpt", std::nullopt,
       s3::ListObjectsV2(local, "ckpt", "run/",
                         "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4+vbOwM=", 250),
       with_token, "us-east-1"},
      {"delete-objects", local, "ckpt", std::nullopt,
       s3::DeleteObjects(local, "ckpt", {"run/a&b<c>", "run/ü c", "run/x+y~z"}), keys, "us-east-1"},
      {"create-multipart-upload", local, "ckpt", odd_key,
       s3::CreateMultipartUpload(local, "ckpt", odd_key), keys, "us-east-1"},
      {"upload-part", local, "ckpt", odd_key,
       s3::UploadPart(local, "ckpt", odd_key, "2~abc/DEF+ghi=", 3, binary), with_token,
       "us-east-1"},
      {"complete-multipart-upload", local, "ckpt", odd_key,
       s3::CompleteMultipartUpload(local, "ckpt", odd_key, "2~abc/DEF+ghi=", parts), keys,
       "us-east-1"},
      {"abort-multipart-upload", local, "ckpt", odd_key,
       s3::AbortMultipartUpload(local, "ckpt", odd_key, "2~abc/DEF+ghi="), keys, "us-east-1"},
      {"virtual-hosted-put", aws, "tidal-ckpt", "jobs/run-1/step-00000100/manifest.json",
       s3::PutObject(aws, "tidal-ckpt", "jobs/run-1/step-00000100/manifest.json", "{}"), with_token,
       "eu-west-1"},
      {"virtual-hosted-list", aws, "tidal-ckpt", std::nullopt,
       s3::ListObjectsV2(aws, "tidal-ckpt", "jobs/run-1/", "", 0), keys, "eu-west-1"},
      {"virtual-hosted-delete", aws, "tidal-ckpt", std::nullopt,
       s3::DeleteObjects(aws, "tidal-ckpt", {"jobs/run-1/step-1/a"}), keys, "eu-west-1"},
      {"https-custom-port", custom_tls, "ckpt", "k",
       s3::GetObject(custom_tls, "ckpt", "k", s3::ByteRange{0, 0}), keys, "us-west-2"},
  };
}

TEST(Sigv4Botocore, SignaturesOfEveryS3RequestMatchBotocore) {
  const sys_seconds now = sys_days(2024y / May / 17) + 12h + 34min + 56s;
  std::vector<Case> cases = Cases();
  nlohmann::json input = {{"requests", nlohmann::json::array()}};
  std::vector<http::Request> signed_requests;
  for (const Case& c : cases) {
    http::Request parsed = c.request;
    ASSERT_TRUE(http::ParseTarget(parsed).ok()) << c.name;
    nlohmann::json query = nlohmann::json::array(), headers = nlohmann::json::array();
    for (const auto& [name, value] : parsed.query) query.push_back({name, value});
    for (const auto& [name, value] : c.request.headers.entries())
      if (name != "host") headers.push_back({name, value});
    input["requests"].push_back({{"name", c.name},
                                 {"method", c.request.method},
                                 {"scheme", c.endpoint.origin.scheme},
                                 {"host", c.endpoint.origin.host},
                                 {"port", c.endpoint.origin.port},
                                 {"path_style", c.endpoint.path_style},
                                 {"bucket", c.bucket},
                                 {"key", c.key ? nlohmann::json(*c.key) : nlohmann::json()},
                                 {"query", query},
                                 {"headers", headers},
                                 {"body_b64", Base64Encode(c.request.body)},
                                 {"access_key_id", c.credentials.access_key_id},
                                 {"secret_access_key", c.credentials.secret_access_key},
                                 {"session_token", c.credentials.session_token},
                                 {"region", c.region},
                                 {"amz_date", sigv4::AmzDate(now)}});
    http::Request request = c.request;
    s3::Sign(request, c.credentials, c.region, now);
    signed_requests.push_back(std::move(request));
  }
  TempDir dir;
  const std::string json_path = dir.path() + "/requests.json";
  std::ofstream(json_path) << input.dump();

  ProcessResult result = RunProcess(
      {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/integration/objstore/botocore_sign.py",
       json_path},
      seconds(60));
  ASSERT_EQ(result.exit_code, 0) << "botocore_sign.py failed (is python3-botocore installed? "
                                    "`make deps`):\n"
                                 << result.err;
  const auto answers = nlohmann::json::parse(result.out);
  ASSERT_EQ(answers.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const http::Request& mine = signed_requests[i];
    const auto& botocore = answers[i];
    ASSERT_EQ(botocore["name"], c.name);
    // Same host and path on the wire (botocore's URL), so the same thing was signed...
    const std::string url = botocore["url"];
    const std::string origin = c.endpoint.origin.scheme + "://" + *mine.headers.Get("host");
    ASSERT_EQ(url.rfind(origin, 0), 0u) << c.name << ": " << url;
    EXPECT_EQ(url.substr(origin.size(), url.find('?') == std::string::npos
                                            ? std::string::npos
                                            : url.find('?') - origin.size()),
              mine.target.substr(0, mine.target.find('?')))
        << c.name;
    // ...and the same signature over it.
    EXPECT_EQ(mine.headers.Get("x-amz-content-sha256"), botocore["content_sha256"]) << c.name;
    EXPECT_EQ(mine.headers.Get("authorization"), botocore["authorization"])
        << c.name << "\nbotocore's canonical request:\n"
        << botocore["canonical_request"].get<std::string>();
    if (!c.credentials.session_token.empty())
      EXPECT_EQ(mine.headers.Get("x-amz-security-token"), c.credentials.session_token) << c.name;
  }
}

}  // namespace
}  // namespace tidal::testing
