// The worker's metric definitions (worker/control/metrics.h): what a scrape shows after a step,
// rendered by prometheus-cpp's own text serializer.
#include "worker/control/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <string>

namespace tidal::worker {
namespace {

std::string Render(const WorkerMetrics& m) {
  return prometheus::TextSerializer().Serialize(m.registry()->Collect());
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(WorkerMetricsTest, ExpertLoadAppearsWithTheFirstMixtureOfExpertsStep) {
  WorkerMetrics metrics("chat-ft");
  engine::StepRecord dense;
  dense.step = 1;
  metrics.OnStep(dense, std::nullopt);
  EXPECT_EQ(Render(metrics).find("tidal_worker_expert_tokens"), std::string::npos);
  EXPECT_EQ(Render(metrics).find("tidal_worker_moe_imbalance"), std::string::npos);

  engine::StepRecord moe;
  moe.step = 2;
  moe.moe_layers = {1, 2};
  moe.expert_tokens = {{30, 10, 0, 0}, {10, 10, 10, 10}};  // layer 1 uneven, layer 2 even
  metrics.OnStep(moe, std::nullopt);
  const std::string text = Render(metrics);
  EXPECT_TRUE(Has(text, R"(tidal_worker_expert_tokens{expert="0",trainingjob="chat-ft"} 40)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_worker_expert_tokens{expert="2",trainingjob="chat-ft"} 10)"));
  EXPECT_TRUE(Has(text, R"(tidal_worker_moe_imbalance{layer="1",trainingjob="chat-ft"} 3)"));
  EXPECT_TRUE(Has(text, R"(tidal_worker_moe_imbalance{layer="2",trainingjob="chat-ft"} 1)"));
}

}  // namespace
}  // namespace tidal::worker
