// What only the s3:// store has to get right, against a real S3-protocol server (moto, verifying
// SigV4), with a fault-injecting proxy in between where S3's failures have to be produced: parallel
// multipart upload, checksums on every body, retries with backoff and when they stop, S3 error
// codes in the Status, and https verified against a CA.
#include "worker/objstore/s3_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>

#include "common/http/pki.h"
#include "tests/integration/objstore/fault_proxy.h"
#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/objstore/store_harness.h"

namespace tidal::testing {
namespace {

using objstore::ObjectStore;
using objstore::OpenObjectStore;
using objstore::S3Options;

constexpr const char* kBucket = "ckpt";

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = S3Server::Start(kBucket);
    ASSERT_TRUE(server_);
  }
  // A store reaching the server through a proxy applying `rule`.
  std::unique_ptr<ObjectStore> ThroughProxy(FaultProxy::Rule rule, int max_attempts = 5,
                                            FaultProxy::AnswerRule answer_rule = nullptr) {
    proxy_ = FaultProxy::Start(server_->port(), std::move(rule), std::move(answer_rule));
    if (!proxy_) return nullptr;
    S3Options options = S3TestOptions(*server_, proxy_->endpoint());
    options.max_attempts = max_attempts;
    auto store = OpenObjectStore("s3://ckpt/run", options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::unique_ptr<ObjectStore> Direct(S3Options options, const std::string& uri = "s3://ckpt/run") {
    auto store = OpenObjectStore(uri, options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
  // A store whose clock is years off (FakeClock's wall clock is in 2023), behind a proxy that
  // refuses skewed requests as S3 does (RefuseSkewed, below); `refused` counts the refusals.
  std::unique_ptr<ObjectStore> SkewedStore(bool in_body, bool in_header, int& refused);
  size_t Count(const std::string& prefix) const {
    auto requests = proxy_->requests();
    return std::count_if(requests.begin(), requests.end(),
                         [&](const std::string& r) { return r.rfind(prefix, 0) == 0; });
  }

  std::unique_ptr<S3Server> server_;
  std::unique_ptr<FaultProxy> proxy_;
};

TEST_F(S3StoreTest, MultipartUploadSendsEveryPartWithChecksumsAndCompletes) {
  auto store = ThroughProxy(nullptr);
  ASSERT_TRUE(store);
  const std::string data = TestBytes(16 * kMiB, 11);
  TIDAL_ASSERT_OK(store->Put("big", data));
  EXPECT_EQ(Count("POST /ckpt/run/big?uploads"), 1u);
  for (int part = 1; part <= 4; ++part)
    EXPECT_EQ(Count("PUT /ckpt/run/big?partNumber=" + std::to_string(part) + "&uploadId="), 1u)
        << "part " << part;
  EXPECT_EQ(Count("POST /ckpt/run/big?uploadId="), 1u);
  EXPECT_EQ(Count("DELETE"), 0u);
  EXPECT_EQ(proxy_->checksum_errors(), std::vector<std::string>{});
  EXPECT_TRUE(store->Get("big").value() == data);

  // At part_size exactly: one plain PUT.
  TIDAL_ASSERT_OK(store->Put("exact", TestBytes(5 * kMiB, 12)));
  EXPECT_EQ(Count("PUT /ckpt/run/exact"), 1u);
  EXPECT_EQ(Count("POST /ckpt/run/exact?uploads"), 0u);
}

TEST_F(S3StoreTest, EveryRequestCarriesTheRealPayloadHash) {
  auto store = ThroughProxy(nullptr);
  ASSERT_TRUE(store);
  TIDAL_ASSERT_OK(store->Put("a b/c+d~ü", "payload"));
  TIDAL_ASSERT_OK(store->Put("empty", ""));
  ASSERT_TRUE(store->Get("a b/c+d~ü").ok());
  ASSERT_TRUE(store->GetRange("a b/c+d~ü", 1, 3).ok());
  ASSERT_TRUE(store->Size("empty").ok());
  ASSERT_TRUE(store->List("").ok());
  TIDAL_ASSERT_OK(store->Delete({"a b/c+d~ü", "empty"}));
  EXPECT_EQ(proxy_->checksum_errors(), std::vector<std::string>{});
  EXPECT_EQ(Count("PUT /ckpt/run/a%20b/c%2Bd~%C3%BC"), 1u)
      << ::testing::PrintToString(proxy_->requests());
}

TEST_F(S3StoreTest, ThrottlingIsRetriedUntilItPasses) {
  int refused = 0;
  auto store = ThroughProxy([&](const http::Request& r) {
    std::optional<http::Response> answer;
    if (r.method == "PUT" && refused < 2) {
      ++refused;
      answer = FaultProxy::S3Error(503, "SlowDown", "Please reduce your request rate.");
    }
    return answer;
  });
  ASSERT_TRUE(store);
  TIDAL_ASSERT_OK(store->Put("k", "v"));
  EXPECT_EQ(Count("PUT /ckpt/run/k"), 3u);
  EXPECT_EQ(Direct(S3TestOptions(*server_, server_->endpoint()))->Get("k").value(), "v");
}

TEST_F(S3StoreTest, RequestTimeoutWithA400IsRetried) {
  bool refused = false;
  auto store = ThroughProxy([&](const http::Request& r) {
    std::optional<http::Response> answer;
    if (r.method == "GET" && !refused) {
      refused = true;
      answer = FaultProxy::S3Error(400, "RequestTimeout", "Your socket connection timed out.");
    }
    return answer;
  });
  ASSERT_TRUE(store);
  TIDAL_ASSERT_OK(store->Put("k", "v"));
  EXPECT_EQ(store->Get("k").value(), "v");
  EXPECT_EQ(Count("GET /ckpt/run/k"), 2u);
}

TEST_F(S3StoreTest, GivesUpAfterMaxAttempts) {
  auto store = ThroughProxy(
      [](const http::Request&) {
        return std::optional<http::Response>(
            FaultProxy::S3Error(500, "InternalError", "We encountered an internal error."));
      },
      3);
  ASSERT_TRUE(store);
  Status s = store->Put("k", "v");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_TRUE(s.retryable());
  EXPECT_NE(s.message().find("s3: PUT s3://ckpt/run/k: HTTP 500 InternalError: We encountered "
                             "an internal error. (after 3 attempts)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(Count("PUT"), 3u);
}

// What AWS S3 answers a request signed more than 15 minutes off its clock, telling its time
// in the body, the Date header, or both.
std::optional<http::Response> RefuseSkewed(const http::Request& r, bool in_body, bool in_header) {
  std::tm tm{};
  const std::string signed_at = r.headers.Get("X-Amz-Date").value_or("");
  if (!strptime(signed_at.c_str(), "%Y%m%dT%H%M%SZ", &tm)) return std::nullopt;
  const auto now = std::chrono::system_clock::now();
  const auto off = std::chrono::system_clock::from_time_t(timegm(&tm)) - now;
  if (std::chrono::abs(off) < std::chrono::minutes(15)) return std::nullopt;
  http::Response answer = FaultProxy::S3Error(
      403, "RequestTimeTooSkewed",
      "The difference between the request time and the current time is too large.");
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  char iso[32], http_date[40];
  std::strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  std::strftime(http_date, sizeof http_date, "%a, %d %b %Y %H:%M:%S GMT", std::gmtime(&t));
  if (in_body)
    answer.body.insert(answer.body.find("</Error>"),
                       "<RequestTime>" + signed_at + "</RequestTime><ServerTime>" + iso +
                           "</ServerTime><MaxAllowedSkewMilliseconds>900000"
                           "</MaxAllowedSkewMilliseconds>");
  if (in_header) answer.headers.Set("Date", http_date);
  return answer;
}

std::unique_ptr<ObjectStore> S3StoreTest::SkewedStore(bool in_body, bool in_header, int& refused) {
  proxy_ =
      FaultProxy::Start(server_->port(), [&refused, in_body, in_header](const http::Request& r) {
        auto answer = RefuseSkewed(r, in_body, in_header);
        refused += answer.has_value();
        return answer;
      });
  if (!proxy_) return nullptr;
  S3Options options = S3TestOptions(*server_, proxy_->endpoint());
  options.clock = std::make_shared<FakeClock>();
  return Direct(options);
}

// A node whose clock is years off (FakeClock's wall clock is in 2023): S3 refuses the first
// request; the store reads the server's time from the answer (its body, or else its Date
// header), signs again at once with it, and every later request is signed right the first time.
TEST_F(S3StoreTest, ANodeClockFarOffIsCorrectedFromTheServersTimeAfterOneRefusal) {
  for (const bool in_body : {true, false}) {
    SCOPED_TRACE(in_body ? "ServerTime in the body" : "the Date header only");
    int refused = 0;
    auto store = SkewedStore(in_body, /*in_header=*/!in_body, refused);
    ASSERT_TRUE(store);
    TIDAL_ASSERT_OK(store->Put("skewed", "v"));
    EXPECT_EQ(refused, 1);
    EXPECT_EQ(Count("PUT /ckpt/run/skewed"), 2u) << "refused once, then signed again";
    EXPECT_EQ(store->Get("skewed").value(), "v");
    TIDAL_ASSERT_OK(store->Put("skewed-2", "w"));
    EXPECT_EQ(refused, 1) << "signed with the server's time from then on";
    EXPECT_EQ(Count("PUT /ckpt/run/skewed-2"), 1u);
  }
}

// Without the server's time in the answer there is nothing to correct with: the refusal is
// reported, naming S3's code, and not retried.
TEST_F(S3StoreTest, ASkewRefusalWithoutTheServersTimeIsReportedNotRetried) {
  int refused = 0;
  auto store = SkewedStore(false, false, refused);
  ASSERT_TRUE(store);
  Status put = store->Put("skewed", "v");
  EXPECT_FALSE(put.ok());
  EXPECT_NE(put.message().find("RequestTimeTooSkewed"), std::string::npos) << put.message();
  EXPECT_EQ(refused, 1);
}

TEST_F(S3StoreTest, AccessDeniedIsNotRetried) {
  auto store = ThroughProxy([](const http::Request&) {
    return std::optional<http::Response>(FaultProxy::S3Error(403, "AccessDenied", "Access Denied"));
  });
  ASSERT_TRUE(store);
  Status s = store->Put("k", "v");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 403 AccessDenied: Access Denied"), std::string::npos)
      << s.message();
  EXPECT_EQ(Count("PUT"), 1u);
}

TEST_F(S3StoreTest, ErrorInsideA200CompleteIsRetried) {
  bool failed_once = false;
  auto store = ThroughProxy([&](const http::Request& r) {
    std::optional<http::Response> answer;
    if (r.method == "POST" && r.target.find("uploadId=") != std::string::npos && !failed_once) {
      failed_once = true;
      answer = FaultProxy::S3Error(200, "InternalError", "We encountered an internal error.");
    }
    return answer;
  });
  ASSERT_TRUE(store);
  const std::string data = TestBytes(11 * kMiB, 13);
  TIDAL_ASSERT_OK(store->Put("big", data));
  EXPECT_EQ(Count("POST /ckpt/run/big?uploadId="), 2u);
  EXPECT_TRUE(store->Get("big").value() == data);
}

// S3 completes the upload but its answer is lost on the way (a proxy's 500, a reset): the retry
// finds no upload (NoSuchUpload, as MinIO and Ceph answer; moto answers 200 again, so the proxy
// answers the retry as they do), and the object S3 made of exactly these parts is the success
// it is — not a failed Put that left an object behind.
TEST_F(S3StoreTest, ACompletionWhoseAnswerIsLostAfterS3AppliedItIsASuccess) {
  auto complete = [](const http::Request& r) {
    return r.method == "POST" && r.target.find("uploadId=") != std::string::npos;
  };
  bool lost_once = false;
  auto store = ThroughProxy(
      [&](const http::Request& r) {
        std::optional<http::Response> answer;
        if (complete(r) && lost_once)
          answer = FaultProxy::S3Error(404, "NoSuchUpload", "The specified upload does not exist.");
        return answer;
      },
      5,
      [&](const http::Request& r, const http::Response&) {
        std::optional<http::Response> answer;
        if (complete(r) && !lost_once) {
          lost_once = true;
          answer = FaultProxy::S3Error(500, "InternalError", "the proxy lost the answer");
        }
        return answer;
      });
  ASSERT_TRUE(store);
  const std::string data = TestBytes(11 * kMiB, 17);
  TIDAL_ASSERT_OK(store->Put("big", data));
  EXPECT_EQ(Count("POST /ckpt/run/big?uploadId="), 2u);
  EXPECT_EQ(Count("HEAD /ckpt/run/big"), 1u);
  EXPECT_EQ(Count("DELETE /ckpt/run/big?uploadId="), 0u) << "a completed upload was aborted";
  EXPECT_TRUE(store->Get("big").value() == data);
}

// The same NoSuchUpload without an object of these parts behind it (the upload was aborted,
// or another writer's object is there) stays a failure.
TEST_F(S3StoreTest, NoSuchUploadWithoutTheObjectOfThesePartsIsAFailure) {
  int completes = 0;
  auto store = ThroughProxy([&](const http::Request& r) {
    std::optional<http::Response> answer;
    if (r.method == "POST" && r.target.find("uploadId=") != std::string::npos)
      answer = ++completes == 1 ? FaultProxy::S3Error(500, "InternalError", "not forwarded")
                                : FaultProxy::S3Error(404, "NoSuchUpload",
                                                      "The specified upload does not exist.");
    return answer;
  });
  ASSERT_TRUE(store);
  TIDAL_ASSERT_OK(store->Put("big", "another writer's object"));
  Status s = store->Put("big", TestBytes(11 * kMiB, 19));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("NoSuchUpload"), std::string::npos) << s.message();
  EXPECT_EQ(store->Get("big").value(), "another writer's object");
}

TEST_F(S3StoreTest, ConnectionFailuresAreRetriedThenReported) {
  S3Options options = S3TestOptions(*server_, "http://127.0.0.1:1");  // nothing listens on port 1
  options.max_attempts = 2;
  auto store = Direct(options);
  ASSERT_TRUE(store);
  Status s = store->Put("k", "v");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("s3: PUT s3://ckpt/run/k: connecting to 127.0.0.1:1"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("(after 2 attempts)"), std::string::npos) << s.message();
}

// Accepts connections, reads the request head and hangs up without answering.
class HangUpServer {
 public:
  HangUpServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        std::string head;
        char buf[4096];
        pollfd in{c, POLLIN, 0};
        while (head.find("\r\n\r\n") == std::string::npos && poll(&in, 1, 5000) > 0) {
          ssize_t n = read(c, buf, sizeof(buf));
          if (n <= 0) break;
          head.append(buf, static_cast<size_t>(n));
        }
        ++connections_;
        close(c);
      }
    });
  }
  ~HangUpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

TEST_F(S3StoreTest, AServerThatHangsUpIsUnavailableNotNotFound) {
  HangUpServer server;
  S3Options options = S3TestOptions(*server_, "http://127.0.0.1:" + std::to_string(server.port()));
  options.max_attempts = 2;
  auto store = Direct(options);
  ASSERT_TRUE(store);
  for (const Status& s : {store->Get("k").status(), store->Size("k").status()}) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("connection closed by 127.0.0.1"), std::string::npos) << s.message();
  }
  EXPECT_EQ(server.connections(), 4);
}

TEST_F(S3StoreTest, UnknownAccessKeyIsRefusedWithTheServersCode) {
  S3Options options = S3TestOptions(*server_, server_->endpoint());
  options.access_key_id = "NOT-A-KEY";
  auto store = Direct(options);
  ASSERT_TRUE(store);
  Status s = store->Put("k", "v");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 403 InvalidAccessKeyId: The AWS Access Key Id you provided "
                             "does not exist in our records."),
            std::string::npos)
      << s.message();
}

// The server verifies SigV4: a request from a known key signed with another secret is refused,
// so the signer is checked by a server, not only by test vectors and botocore.
TEST_F(S3StoreTest, ARequestSignedWithTheWrongSecretIsRefused) {
  S3Options options = S3TestOptions(*server_, server_->endpoint());
  options.secret_access_key = server_->secret_key() + "x";
  auto store = Direct(options);
  ASSERT_TRUE(store);
  Status s = store->Put("k", "v");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 403 SignatureDoesNotMatch"), std::string::npos) << s.message();
  // The right secret, same key and store code: accepted.
  TIDAL_ASSERT_OK(Direct(S3TestOptions(*server_, server_->endpoint()))->Put("k", "v"));
}

TEST_F(S3StoreTest, MissingBucketIsNotFoundNamingTheBucket) {
  auto store = Direct(S3TestOptions(*server_, server_->endpoint()), "s3://no-such-bucket/run");
  ASSERT_TRUE(store);
  for (const Status& s :
       {store->Get("k").status(), store->Put("k", "v"), store->List("").status()}) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("bucket \"no-such-bucket\" does not exist"), std::string::npos)
        << s.message();
  }
}

TEST_F(S3StoreTest, HttpsEndpointIsVerifiedAgainstTheGivenCa) {
  TempDir pki_dir;
  auto ca = http::GenerateCa("tidal-test-ca", 1);
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  http::CertificateRequest request;
  request.common_name = "s3-test-server";
  request.ip_addresses = {"127.0.0.1"};
  auto cert = http::IssueCertificate(*ca, request);
  ASSERT_TRUE(cert.ok()) << cert.status().ToString();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(pki_dir.path() + "/" + name) << text;
    return pki_dir.path() + "/" + name;
  };
  S3Server::Tls tls{write("key.pem", cert->key_pem), write("cert.pem", cert->cert_pem)};
  auto https = S3Server::Start(kBucket, tls);
  ASSERT_TRUE(https);
  ASSERT_EQ(https->endpoint().rfind("https://", 0), 0u);

  S3Options options = S3TestOptions(*https, https->endpoint());
  options.ca_file = write("ca.pem", ca->cert_pem);
  auto store = Direct(options);
  ASSERT_TRUE(store);
  TIDAL_ASSERT_OK(store->Put("over-tls", "secret bytes"));
  EXPECT_EQ(store->Get("over-tls").value(), "secret bytes");

  // A server whose certificate no trusted CA signed is refused.
  auto other_ca = http::GenerateCa("someone-else", 1);
  ASSERT_TRUE(other_ca.ok());
  options.ca_file = write("other-ca.pem", other_ca->cert_pem);
  options.max_attempts = 1;
  auto untrusting = Direct(options);
  ASSERT_TRUE(untrusting);
  Status s = untrusting->Get("over-tls").status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("certificate"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace tidal::testing
