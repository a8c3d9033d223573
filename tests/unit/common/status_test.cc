// Status and StatusOr: errors are values that carry a code, a message and retryability.
#include "common/status.h"

#include <gtest/gtest.h>

namespace tidal {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x: expected an even number, got " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  TIDAL_ASSIGN_OR_RETURN(int half, Half(x));
  return Half(half);
}

TEST(StatusTest, AssignOrReturnPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "x: expected an even number, got 3");
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, OnlyTransientErrorsAreRetryable) {
  EXPECT_TRUE(Unavailable("peer gone").retryable());
  EXPECT_FALSE(InvalidArgument("bad spec").retryable());
  EXPECT_FALSE(OkStatus().retryable());
}

TEST(StatusTest, WithContextPrefixesTheMessageAndKeepsTheCode) {
  Status s = NotFound("no such file").WithContext("config.yaml");
  EXPECT_EQ(s.message(), "config.yaml: no such file");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(OkStatus().WithContext("x").ok());
}

TEST(StatusTest, StatusOrFromOkStatusIsAnInternalError) {
  StatusOr<int> wrong{OkStatus()};
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace tidal
