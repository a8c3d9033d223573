// Which S3 failures are retried and how long the full-jitter backoff waits, without sleeping.
#include "worker/objstore/s3_retry.h"

#include <gtest/gtest.h>

namespace tidal::objstore::s3 {
namespace {

using std::chrono::milliseconds;

TEST(S3Retry, RetriesThrottlingTimeoutsAndServerErrors) {
  struct Case {
    int status;
    const char* code;
    bool retryable;
  };
  const Case cases[] = {
      {503, "SlowDown", true},
      {500, "InternalError", true},
      {400, "RequestTimeout", true},  // a 4xx that S3 wants retried
      {200, "InternalError", true},   // CompleteMultipartUpload's error inside a 200
      {429, "", true},
      {502, "", true},
      {504, "", true},
      {501, "NotImplemented", false},
      {404, "NoSuchKey", false},
      {404, "NoSuchBucket", false},
      {403, "AccessDenied", false},
      {403, "SignatureDoesNotMatch", false},
      {400, "MalformedXML", false},
      {416, "InvalidRange", false},
      {405, "MethodNotAllowed", false},
  };
  for (const Case& c : cases)
    EXPECT_EQ(IsRetryableAnswer(c.status, c.code), c.retryable) << c.status << " " << c.code;
}

TEST(S3Retry, RetriesTransportFailuresButNotBadAnswers) {
  EXPECT_TRUE(IsRetryableTransportError(Unavailable("connecting to 127.0.0.1:1: refused")));
  EXPECT_TRUE(IsRetryableTransportError(DeadlineExceeded("reading: timed out")));
  EXPECT_TRUE(IsRetryableTransportError(NotFound("connection closed by 127.0.0.1:9000")));
  EXPECT_FALSE(IsRetryableTransportError(InvalidArgument("body exceeds the limit")));
  EXPECT_FALSE(IsRetryableTransportError(OkStatus()));
}

TEST(S3Retry, FullJitterDrawsBelowAnExponentialCeiling) {
  RetryPolicy policy{5, milliseconds(100), milliseconds(2000)};
  // The ceiling doubles per failure: 100, 200, 400, 800, 1600, then the 2000 cap.
  const int ceilings[] = {100, 200, 400, 800, 1600, 2000, 2000};
  for (int failures = 1; failures <= 7; ++failures) {
    const int ceiling = ceilings[failures - 1];
    EXPECT_EQ(BackoffDelay(policy, failures, 0.0), milliseconds(0)) << failures;
    EXPECT_EQ(BackoffDelay(policy, failures, 0.5), milliseconds(ceiling / 2)) << failures;
    EXPECT_EQ(BackoffDelay(policy, failures, 0.9999), milliseconds(ceiling - 1)) << failures;
  }
}

TEST(S3Retry, BackoffNeverOverflowsAndClampsTheDraw) {
  RetryPolicy policy{20, milliseconds(100), milliseconds(20000)};
  EXPECT_EQ(BackoffDelay(policy, 1000, 0.5), milliseconds(10000));
  EXPECT_EQ(BackoffDelay(policy, 0, 0.5), milliseconds(50));  // treated as the first failure
  EXPECT_EQ(BackoffDelay(policy, 1, 7.0), milliseconds(100));
  EXPECT_EQ(BackoffDelay(policy, 1, -1.0), milliseconds(0));
  RetryPolicy none{3, milliseconds(0), milliseconds(0)};
  EXPECT_EQ(BackoffDelay(none, 3, 0.9), milliseconds(0));
}

}  // namespace
}  // namespace tidal::objstore::s3
