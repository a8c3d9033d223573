// The engine against an independent implementation: tests/golden/make_golden.py builds a
// LLaMA-style model with PyTorch's nn.Module (HF LlamaForCausalLM conventions), writes it as
// an HF directory with its own safetensors writer, and records its logits for a batch. The
// engine must load that directory and reproduce the logits.
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/integration/process.h"
#include "tests/test_paths.h"
#include "tests/unit/engine/test_util.h"
#include "worker/engine/comm.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/safetensors.h"

namespace tidal::engine {
namespace {

using namespace std::chrono_literals;

class GoldenTest : public ::testing::TestWithParam<int> {};

TEST_P(GoldenTest, EngineReproducesPyTorchReferenceLogitsFromItsHfDirectory) {
  testing::TempDir dir;
  auto made = tidal::testing::RunProcess(
      {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/golden/make_golden.py", dir.path()},
      300s);
  ASSERT_EQ(made.exit_code, 0) << made.err;

  auto golden = SafetensorsFile::Open(dir.path() + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  auto tokens = *(*golden)->Read("tokens", torch::kInt64);
  auto expected = *(*golden)->Read("logits", torch::kFloat32);

  auto hf = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  LoraSpec lora;  // adapters start at B = 0: they must not change the outputs
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  DecoderModel model((*hf)->config(), lora);
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {GetParam(), torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(params.Load((*hf)->Reader(model, 0)).ok());
  auto actual = testing::Logits(params, model, tokens);
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-4, 1e-5))
      << "max abs difference " << (actual - expected).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(Zero0And3, GoldenTest, ::testing::Values(0, 3));

}  // namespace
}  // namespace tidal::engine
