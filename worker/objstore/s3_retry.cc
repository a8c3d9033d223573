// worker/objstore/s3_retry.cc
#include "worker/objstore/s3_retry.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tidal::objstore::s3 {

bool IsRetryableAnswer(int http_status, std::string_view code) {
  // botocore's standard retry mode: throttling codes and transient service errors.
  static constexpr std::array<std::string_view, 11> kRetryableCodes = {"SlowDown",
                                                                       "InternalError",
                                                                       "RequestTimeout",
                                                                       "ServiceUnavailable",
                                                                       "Throttling",
                                                                       "ThrottlingException",
                                                                       "RequestThrottled",
                                                                       "RequestLimitExceeded",
                                                                       "BandwidthLimitExceeded",
                                                                       "TooManyRequestsException",
                                                                       "RequestThrottledException"};
  if (std::find(kRetryableCodes.begin(), kRetryableCodes.end(), code) != kRetryableCodes.end())
    return true;
  if (http_status == 429) return true;
  return http_status >= 500 && http_status != 501;
}

bool IsRetryableTransportError(const Status& status) {
  return !status.ok() && status.code() != StatusCode::kInvalidArgument &&
         status.code() != StatusCode::kFailedPrecondition;
}

std::chrono::milliseconds BackoffDelay(const RetryPolicy& policy, int failed_attempts,
                                       double uniform01) {
  const double base = static_cast<double>(policy.base_delay.count());
  const double cap = static_cast<double>(policy.max_delay.count());
  const int exponent = std::clamp(failed_attempts - 1, 0, 62);
  const double ceiling = std::min(cap, base * std::ldexp(1.0, exponent));
  const double draw = std::clamp(uniform01, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::floor(ceiling * draw)));
}

}  // namespace tidal::objstore::s3
