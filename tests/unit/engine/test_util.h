// tests/unit/engine/test_util.h — small builders shared by the engine's unit tests.
#pragma once

#include <filesystem>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "api/train_config.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "worker/data/provider.h"
#include "worker/engine/model.h"
#include "worker/engine/zero.h"

namespace tidal::engine::testing {

// A base model of `config` with random weights — norms and biases moved away from 1 and 0 so
// that they count — in HF names, for WriteHfDirectory.
inline std::vector<std::pair<std::string, torch::Tensor>> RandomBaseWeights(
    const ModelConfig& config) {
  DecoderModel plain(config, LoraSpec{.target_modules = {}});
  torch::manual_seed(3);
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const BlockSpec& block : plain.blocks())
    for (const ParamSpec& p : block.params) {
      torch::Tensor t = plain.InitialValue(p, 17);
      if (p.shape.size() == 1) t = t + 0.1 * torch::randn(p.shape);
      weights.emplace_back(p.name, t);
    }
  return weights;
}

// The JSON log lines of a process's output whose "msg" is `msg` (e.g. each rank's "engine
// ready"), or, with `msg` empty, its step lines (those with a "loss").
inline std::vector<nlohmann::json> JsonLines(const std::string& text, const std::string& msg) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (msg.empty() ? j.contains("loss") : j.value("msg", "") == msg) lines.push_back(j);
  }
  return lines;
}

inline std::string SampleData() {
  return std::string(TIDAL_SOURCE_DIR) + "/examples/data/sample.jsonl";
}

// Token stores tidal-prep writes for this test process (removed at exit).
inline const std::string& PreparedDir() {
  static tidal::testing::ScratchDir dir;
  return dir.path();
}

// The rows of `config`'s dataset through the real pipeline: prepared (tidal-prep's work) into
// a token store, then read by the loader.
inline std::unique_ptr<RowSource> OpenRows(TrainConfig config) {
  if (config.dataset.prepared_uri.empty()) config.dataset.prepared_uri = PreparedDir();
  data::StoreDataProvider provider({});
  Status prepared = provider.Prepare(config);
  EXPECT_TRUE(prepared.ok()) << prepared.message();
  auto rows = provider.Open(config, 0);
  EXPECT_TRUE(rows.ok()) << rows.status().message();
  return rows.ok() ? std::move(*rows) : nullptr;
}

// A fast config for the tiny preset on the shipped sample data.
inline TrainConfig TinyConfig(int zero_stage, double dropout = 0.0) {
  TrainConfig c;
  c.model.preset = "tiny";
  c.dataset.uri = SampleData();
  c.dataset.prepared_uri = PreparedDir();
  c.dataset.max_seq_len = 32;
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.dropout = dropout;
  c.lora.target_modules = {"q_proj", "v_proj", "o_proj", "down_proj"};
  c.optimization.zero_stage = zero_stage;
  c.optimization.precision = "fp32";
  c.optimization.global_batch_size = 4;
  c.optimization.micro_batch_size = 2;
  c.optimization.learning_rate = 3e-3;
  c.optimization.max_steps = 10;
  return c;
}

// Logits of `params` for `tokens` (no graph).
inline torch::Tensor Logits(ShardedParameters& params, const DecoderModel& model,
                            const torch::Tensor& tokens) {
  ForwardContext ctx;
  ctx.tokens = tokens;
  std::tie(ctx.rope_cos, ctx.rope_sin) = model.RopeTables(tokens.size(1), torch::kCPU);
  torch::NoGradGuard no_grad;
  auto logits = params.Forward(ctx);
  if (!logits.ok()) ADD_FAILURE() << logits.status().message();
  return logits.ok() ? *logits : torch::Tensor();
}

// A fresh directory under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tidal-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tidal::engine::testing
