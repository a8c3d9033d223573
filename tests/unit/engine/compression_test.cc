// Top-k selection with error feedback on one bucket (worker/engine/compression.h): what is sent
// plus what is kept is exactly what came in, the largest entries go first, ratio 1 sends
// everything, and a packed exchange sums every group's entries in fp64 wherever they collide.
#include "worker/engine/compression.h"

#include <gtest/gtest.h>

namespace tidal::engine {
namespace {

TEST(CompressionTest, TopKCountIsTheCeilingOfTheRatioAndAtLeastOne) {
  struct Case {
    int64_t numel;
    double ratio;
    int64_t k;
  } cases[] = {{100, 0.05, 5}, {101, 0.05, 6}, {10, 0.01, 1},    {7, 1.0, 7},
               {1, 0.5, 1},    {0, 0.5, 0},    {1000, 0.001, 1}, {3, 0.34, 2}};
  for (const Case& c : cases)
    EXPECT_EQ(TopKCount(c.numel, c.ratio), c.k) << c.numel << " at " << c.ratio;
}

TEST(CompressionTest, TheLargestMagnitudesOfGradientPlusResidualAreSentAndTheRestKept) {
  auto grad = torch::tensor({0.1f, -3.0f, 0.5f, 2.0f, -0.2f, 0.0f});
  auto residual = torch::tensor({0.0f, 0.0f, 0.0f, 0.0f, -4.0f, 0.3f});
  torch::Tensor next;
  SparseGradient sent = TopKWithFeedback(grad, residual, 2, &next);
  // u = [0.1, -3, 0.5, 2, -4.2, 0.3]: |-4.2| and |-3| are the two largest.
  auto order = std::get<1>(sent.indices.sort());
  EXPECT_TRUE(torch::equal(sent.indices.index_select(0, order), torch::tensor({1, 4})));
  EXPECT_TRUE(torch::allclose(sent.values.index_select(0, order), torch::tensor({-3.0f, -4.2f})));
  EXPECT_TRUE(torch::allclose(next, torch::tensor({0.1f, 0.0f, 0.5f, 2.0f, 0.0f, 0.3f})));
  // Nothing lost: sent + kept == gradient + old residual, exactly.
  auto dense = torch::zeros({6});
  dense.index_add_(0, sent.indices, sent.values);
  EXPECT_TRUE(torch::equal(dense + next, grad + residual));
}

TEST(CompressionTest, ErrorFeedbackDeliversEveryEntryEventually) {
  // A small entry that never wins on its own is sent once its residual has grown enough.
  auto grad = torch::tensor({1.0f, 0.3f});
  auto residual = torch::zeros({2});
  int64_t sent_small_at = -1;
  for (int step = 0; step < 10 && sent_small_at < 0; ++step) {
    torch::Tensor next;
    SparseGradient sent = TopKWithFeedback(grad, residual, 1, &next);
    if (sent.indices[0].item<int64_t>() == 1) sent_small_at = step;
    residual = next;
  }
  EXPECT_EQ(sent_small_at, 3);  // residual 0.3, 0.6, 0.9, then 1.2 > 1.0
}

TEST(CompressionTest, RatioOneSendsEverythingInOrderAndKeepsNothing) {
  auto grad = torch::randn({17});
  auto residual = torch::randn({17});
  torch::Tensor next;
  SparseGradient sent = TopKWithFeedback(grad, residual, 17, &next);
  EXPECT_TRUE(torch::equal(sent.indices, torch::arange(17)));
  EXPECT_TRUE(torch::equal(sent.values, grad + residual));
  EXPECT_TRUE(torch::equal(next, torch::zeros({17})));
}

TEST(CompressionTest, PackedGroupsAreSummedInFp64WhereTheirIndicesCollide) {
  const int64_t k = 2;
  SparseGradient a{torch::tensor({3, 0}), torch::tensor({1.0f, 1e-8f})};
  SparseGradient b{torch::tensor({0, 5}), torch::tensor({1.0f, -2.5f})};
  SparseGradient c{torch::tensor({3, 4}), torch::tensor({0.25f, 7.0f})};
  // Two ranks: the first holds groups a and b, the second c and a copy of a.
  auto gathered = torch::cat({PackSparse({a, b}), PackSparse({c, a})});
  EXPECT_EQ(gathered.scalar_type(), torch::kInt32);
  EXPECT_EQ(gathered.numel(), 4 * 2 * k);
  auto dense = torch::zeros({6}, torch::kFloat64);
  AddPackedInto(gathered, k, dense);
  auto want = torch::tensor({1.0 + 2e-8, 0.0, 0.0, 2.25, 7.0, -2.5}, torch::kFloat64);
  // 1 + 2e-8 is not an fp32 value: the sum is kept in fp64.
  EXPECT_TRUE(torch::allclose(dense, want, /*rtol=*/0, /*atol=*/1e-15)) << dense;
}

}  // namespace
}  // namespace tidal::engine
