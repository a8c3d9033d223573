// Exports as a user runs them: tidal-train (2 ranks, ZeRO-3) fine-tunes LoRA adapters on an HF
// base directory and leaves <uri>/final/ in PEFT's layout; tidal-export writes the adapter of
// any step, or the merged model. Each export must give the logits of the engine's model with
// the adapter as the checkpoint holds it: the adapter file applied to the base weights by hand
// from its PEFT names and config, the merged directory loaded as a plain model, and the real
// transformers + PEFT (tools/venv) loading the adapter and the merged directory.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/integration/run_cache.h"
#include "tests/test_paths.h"
#include "tests/unit/engine/test_util.h"
#include "worker/checkpoint/repository.h"
#include "worker/engine/comm.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/engine/model_config.h"
#include "worker/engine/safetensors.h"
#include "worker/objstore/object_store.h"

namespace tidal::engine {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tidal::testing::ProcessResult;
using tidal::testing::RunProcess;

LoraSpec NoAdapters() {
  LoraSpec none;
  none.target_modules.clear();
  return none;
}

// Logits of a model with no adapters whose weights are `named`.
torch::Tensor PlainLogits(const ModelConfig& config,
                          const std::map<std::string, torch::Tensor>& named,
                          const torch::Tensor& tokens) {
  DecoderModel model(config, NoAdapters());
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  Status loaded = params.Load(
      [&](const ParamSpec& spec, int64_t first, int64_t count) -> StatusOr<torch::Tensor> {
        auto it = named.find(spec.name);
        if (it == named.end()) return NotFound(spec.name);
        return it->second.to(torch::kFloat32).reshape({-1}).narrow(0, first, count);
      });
  EXPECT_TRUE(loaded.ok()) << loaded.message();
  return testing::Logits(params, model, tokens);
}

std::map<std::string, torch::Tensor> ReadAll(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return out;
  for (const auto& [name, entry] : (*file)->entries())
    out[name] = *(*file)->Read(name, entry.dtype);
  return out;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

::testing::AssertionResult Close(const torch::Tensor& actual, const torch::Tensor& expected,
                                 double rtol = 1e-4, double atol = 1e-5) {
  if (actual.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shapes differ";
  if (torch::allclose(actual, expected, rtol, atol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max abs difference " << (actual - expected).abs().max().item<double>();
}

class ExportTest : public ::testing::Test {
 protected:
  static constexpr int64_t kSteps = 8;

  // The suite's one training run (the base directory and the checkpoints in `run_`, made once
  // per build of tidal-train and shared by the cases, each a process of its own under ctest,
  // never written by them), and the engine's logits for its final checkpoint. Each case writes
  // its exports under `dir_`.
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "tidal-export-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    // The base: the tiny preset's shape with random weights (norms too), as an HF directory.
    config_ = *PresetModelConfig("tiny");
    DecoderModel base_model(config_, NoAdapters());
    torch::manual_seed(5);
    std::vector<std::pair<std::string, torch::Tensor>> base;
    for (const BlockSpec& block : base_model.blocks())
      for (const ParamSpec& p : block.params) {
        torch::Tensor t = base_model.InitialValue(p, 11);
        if (p.shape.size() == 1) t = 1.0 + 0.1 * torch::randn(p.shape);
        base.emplace_back(p.name, t);
      }
    for (auto& [name, t] : base) base_[name] = t;

    auto job = [](const std::string& run) {
      std::ostringstream y;
      y << "model: {uri: " << run << "/base}\n"
        << "dataset: {uri: " << TIDAL_SOURCE_DIR
        << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32, tokenizer: bytes}\n"
        << "lora: {rank: 4, alpha: 12, dropout: 0.1,"
        << " targetModules: [q_proj, k_proj, o_proj, gate_proj, down_proj]}\n"
        << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 1,"
        << " learningRate: 5.0e-3, maxSteps: " << kSteps << ", seed: 2}\n";
      return y.str();
    };
    // The key: the job (as written for any directory), the binary that trains it, and this
    // one, which makes the base (`base_` is made again by every case and must be the same).
    const std::string key = tidal::testing::WithFileIdentity(
        tidal::testing::WithFileIdentity(job("<run>"), TIDAL_TRAIN_BIN), "/proc/self/exe");
    run_ = tidal::testing::CachedRun(
        TIDAL_TEST_CACHE_DIR, "export-suite", key, [&](const std::string& into) {
          Status written = WriteHfDirectory(into + "/base", config_, base, 1'000'000'000);
          if (!written.ok()) {
            train_error_ = "the base directory: " + written.message();
            return false;
          }
          std::ofstream(into + "/job.yaml") << job(into);
          ProcessResult train =
              RunProcess({TIDAL_TRAIN_BIN, "--config", into + "/job.yaml", "--nproc", "2",
                          "--checkpoint-uri", into + "/ckpt", "--full-every", "4"},
                         300s);
          if (train.exit_code != 0) train_error_ = "tidal-train: " + train.err;
          return train.exit_code == 0;
        });
    if (run_.empty()) return;
    tokens_ = new torch::Tensor(torch::randint(0, 256, {2, 24}, torch::kInt64));
    expected_ = new torch::Tensor(EngineLogits(kSteps));
  }
  static void TearDownTestSuite() {
    delete tokens_;
    delete expected_;
    fs::remove_all(dir_);
  }
  void SetUp() override {
    ASSERT_FALSE(run_.empty()) << train_error_;
    ASSERT_TRUE(expected_->defined());
    // The adapters matter: the base weights alone give other logits.
    ASSERT_FALSE(Close(PlainLogits(config_, base_, *tokens_), *expected_));
  }

  // The engine's model with the adapters of checkpoint `step`, read from the checkpoint itself.
  static torch::Tensor EngineLogits(int64_t step) {
    auto store = objstore::OpenObjectStore(run_ + "/ckpt");
    EXPECT_TRUE(store.ok());
    checkpoint::Repository repo(**store);
    auto manifest = repo.ReadManifest(step);
    EXPECT_TRUE(manifest.ok()) << manifest.status().message();
    auto hf = HfCheckpoint::Open(run_ + "/base");
    LoraSpec lora;
    lora.rank = 4;
    lora.alpha = 12;
    lora.target_modules = {"q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"};
    DecoderModel model((*hf)->config(), lora);
    auto comm = MakeSingleRankComm();
    ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
    ParameterReader base = (*hf)->Reader(model, 0);
    Status loaded = params.Load(
        [&](const ParamSpec& spec, int64_t first, int64_t count) -> StatusOr<torch::Tensor> {
          if (!spec.trainable) return base(spec, first, count);
          TIDAL_ASSIGN_OR_RETURN(std::string bytes,
                                 repo.ReadTensor(*manifest, spec.name, first, count));
          return torch::from_blob(bytes.data(), {count}, torch::kFloat32).clone();
        });
    EXPECT_TRUE(loaded.ok()) << loaded.message();
    return testing::Logits(params, model, *tokens_);
  }

  static ProcessResult Export(std::vector<std::string> args) {
    args.insert(args.begin(), TIDAL_EXPORT_BIN);
    return RunProcess(args, 120s);
  }

  // The base weights with `adapter_dir`'s adapter applied as PEFT defines it: for every
  // "base_model.model.<module>.lora_A.weight", W(<module>) += lora_alpha / r · B · A.
  static torch::Tensor LogitsFromAdapterFiles(const std::string& adapter_dir) {
    nlohmann::json config = ReadJson(adapter_dir + "/adapter_config.json");
    EXPECT_EQ(config.value("peft_type", ""), "LORA");
    const double scale = config["lora_alpha"].get<double>() / config["r"].get<double>();
    auto adapter = ReadAll(adapter_dir + "/adapter_model.safetensors");
    std::map<std::string, torch::Tensor> weights = base_;
    const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
    int applied = 0;
    for (const auto& [key, a] : adapter) {
      EXPECT_EQ(key.rfind(prefix, 0), 0u) << key;
      if (key.size() < a_suffix.size() ||
          key.compare(key.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
        continue;
      const std::string module =
          key.substr(prefix.size(), key.size() - prefix.size() - a_suffix.size());
      const torch::Tensor& b = adapter.at(prefix + module + ".lora_B.weight");
      torch::Tensor& w = weights.at(module + ".weight");
      w = w + scale * torch::matmul(b, a);
      ++applied;
    }
    EXPECT_EQ(applied, 5 * config_.num_hidden_layers);
    return PlainLogits(config_, weights, *tokens_);
  }

  static std::string dir_, run_, train_error_;
  static ModelConfig config_;
  static std::map<std::string, torch::Tensor> base_;
  static torch::Tensor* tokens_;
  static torch::Tensor* expected_;
};
std::string ExportTest::dir_, ExportTest::run_, ExportTest::train_error_;
ModelConfig ExportTest::config_;
std::map<std::string, torch::Tensor> ExportTest::base_;
torch::Tensor* ExportTest::tokens_ = nullptr;
torch::Tensor* ExportTest::expected_ = nullptr;

TEST_F(ExportTest, FinalAdapterAppliedToTheBaseWeightsGivesTheEnginesLogits) {
  const std::string final_dir = run_ + "/ckpt/final";
  nlohmann::json config = ReadJson(final_dir + "/adapter_config.json");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 12);
  EXPECT_EQ(config["lora_dropout"], 0.1);
  EXPECT_EQ(config["base_model_name_or_path"], run_ + "/base");
  EXPECT_EQ(config["target_modules"],
            nlohmann::json({"q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"}));
  EXPECT_TRUE(Close(LogitsFromAdapterFiles(final_dir), *expected_));
}

TEST_F(ExportTest, ExportOfAnEarlierStepGivesThatStepsLogits) {
  const std::string out = dir_ + "/step4";
  ProcessResult r = Export({"--checkpoint", run_ + "/ckpt", "--step", "4", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["step"], 4);
  torch::Tensor at4 = LogitsFromAdapterFiles(out);
  EXPECT_TRUE(Close(at4, EngineLogits(4)));
  EXPECT_FALSE(Close(at4, *expected_));
}

TEST_F(ExportTest, MergedDirectoryLoadsAsAPlainModelWithTheEnginesLogits) {
  const std::string out = dir_ + "/merged";
  ProcessResult r = Export({"--merge", "--checkpoint", run_ + "/ckpt", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["step"], kSteps);
  EXPECT_EQ(report["adaptedWeights"], 5 * config_.num_hidden_layers);
  EXPECT_EQ(report["dtype"], "F32");  // the base's

  auto hf = HfCheckpoint::Open(out);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  DecoderModel model((*hf)->config(), NoAdapters());
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(params.Load((*hf)->Reader(model, 0)).ok());
  EXPECT_TRUE(Close(testing::Logits(params, model, *tokens_), *expected_));
  for (const auto& entry : fs::directory_iterator(out))
    EXPECT_EQ(entry.path().string().find("lora"), std::string::npos);
}

TEST_F(ExportTest, MergedDirectoryInBf16IsStoredAndRecordedAsBf16) {
  const std::string out = dir_ + "/merged-bf16";
  ProcessResult r = Export({"--merge", "--checkpoint", run_ + "/ckpt", "--out", out, "--dtype",
                            "bf16", "--max-shard-bytes", "1000000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadJson(out + "/config.json")["torch_dtype"], "bfloat16");
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  auto hf = HfCheckpoint::Open(out);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ((*hf)->StoredDtype("model.layers.0.self_attn.q_proj.weight"), torch::kBFloat16);
  DecoderModel model((*hf)->config(), NoAdapters());
  auto comm = MakeSingleRankComm();
  ShardedParameters params(model, *comm, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(params.Load((*hf)->Reader(model, 0)).ok());
  // bf16 keeps 8 bits of mantissa: the logits agree to a few parts in a hundred.
  EXPECT_TRUE(Close(testing::Logits(params, model, *tokens_), *expected_, 5e-2, 5e-2));
}

// What a user does with the adapter: transformers loads the base directory and PEFT's
// PeftModel.from_pretrained applies the adapter (tools/venv's real packages).
TEST_F(ExportTest, PeftLoadsTheAdapterOntoTheTransformersBaseAndGivesTheEnginesLogits) {
  const std::string tokens = dir_ + "/tokens.safetensors", out = dir_ + "/peft-logits.safetensors";
  ASSERT_TRUE(WriteSafetensors(tokens, {{"tokens", *tokens_}}, {}).ok());
  ProcessResult r =
      RunProcess({TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/hf/export_logits.py",
                  "adapter", run_ + "/base", run_ + "/ckpt/final", tokens, out},
                 300s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["lora_weights"], 2 * 5 * config_.num_hidden_layers);
  EXPECT_TRUE(Close(ReadAll(out).at("logits"), *expected_));
}

// The merged model is a plain transformers checkpoint: AutoModelForCausalLM loads it with no
// missing or unexpected keys and gives the engine's logits.
TEST_F(ExportTest, TransformersLoadsTheMergedDirectoryAndGivesTheEnginesLogits) {
  const std::string merged = dir_ + "/merged-for-transformers";
  ProcessResult exported = Export(
      {"--merge", "--checkpoint", run_ + "/ckpt", "--out", merged, "--max-shard-bytes", "1000000"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  ASSERT_TRUE(fs::exists(merged + "/model.safetensors.index.json"));
  const std::string tokens = dir_ + "/tokens-merged.safetensors",
                    out = dir_ + "/merged-logits.safetensors";
  ASSERT_TRUE(WriteSafetensors(tokens, {{"tokens", *tokens_}}, {}).ok());
  ProcessResult r =
      RunProcess({TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/hf/export_logits.py",
                  "merged", merged, tokens, out},
                 300s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(Close(ReadAll(out).at("logits"), *expected_));
}

TEST_F(ExportTest, BadInvocationsAreRefusedNamingWhatIsWrong) {
  const std::string ckpt = run_ + "/ckpt";
  fs::create_directories(dir_ + "/empty");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {{"--out", dir_ + "/x"}, 2, "--checkpoint is required"},
      {{"--checkpoint", ckpt}, 2, "--out is required"},
      {{"--checkpoint", ckpt, "--out", dir_ + "/x", "--step", "-1"}, 2, "--step: expected"},
      {{"--checkpoint", ckpt, "--out", dir_ + "/x", "--dtype", "bf16"}, 2, "only with --merge"},
      {{"--merge", "--checkpoint", ckpt, "--out", dir_ + "/x", "--dtype", "int8"},
       2,
       "--dtype: expected fp32, bf16 or fp16"},
      {{"--merge", "--checkpoint", ckpt, "--out", "s3://bucket/x"},
       2,
       "--merge writes a local directory"},
      {{"--checkpoint", "ftp://host/x", "--out", dir_ + "/x"}, 2, "ftp://host/x"},
      {{"--checkpoint", dir_ + "/empty", "--out", dir_ + "/x"}, 1, "no usable checkpoint"},
      {{"--checkpoint", ckpt, "--step", "5", "--out", dir_ + "/x"}, 1, "step-00000005"},
      {{"--merge", "--checkpoint", ckpt, "--out", dir_ + "/x", "--base-model", dir_ + "/gone"},
       1,
       dir_.c_str()},
      {{"--frobnicate", "1"}, 2, "unknown flag --frobnicate"},
  };
  for (const Case& c : cases) {
    ProcessResult r = Export(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/x/adapter_config.json"));
}

}  // namespace
}  // namespace tidal::engine
