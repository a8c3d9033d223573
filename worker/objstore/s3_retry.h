// worker/objstore/s3_retry.h — when an S3 request is tried again, and how long to wait
// first: pure functions (the random draw comes in as a number), tested without sleeping.
// What is retried follows the AWS SDKs' standard retry mode: transport failures, 5xx (but 501
// Not Implemented), 429, and the throttling/timeout error codes S3 may send with a 4xx status
// (RequestTimeout is a 400). The wait is "full jitter" exponential backoff, as in the AWS
// Architecture Blog's "Exponential Backoff And Jitter" (2015): uniform in
// [0, min(max_delay, base_delay · 2^(failed attempts − 1))).
#pragma once

#include <chrono>
#include <string_view>

#include "common/status.h"

namespace tidal::objstore::s3 {

struct RetryPolicy {
  int max_attempts = 5;  // attempts in all, the first included
  std::chrono::milliseconds base_delay{100};
  std::chrono::milliseconds max_delay{20000};
};

// An answer with this HTTP status and S3 error Code ("" when none) is worth another attempt.
bool IsRetryableAnswer(int http_status, std::string_view code);
// A request that got no answer (connect, write or read failed, timed out) is worth another
// attempt; a malformed or oversized answer (InvalidArgument) is not.
bool IsRetryableTransportError(const Status& status);
// The wait before the next attempt after `failed_attempts` (>= 1) failures; `uniform01` is a
// draw from [0, 1).
std::chrono::milliseconds BackoffDelay(const RetryPolicy& policy, int failed_attempts,
                                       double uniform01);

}  // namespace tidal::objstore::s3
