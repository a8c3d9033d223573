// spec.model.uri on s3:// (a real S3-protocol server, SigV4): an HF directory read by byte range
// — each ZeRO-3 rank fetches about its own share — and, with the block checksums
// `tidal-prep --checksum-model` writes, verified: the same logits and the same training as the
// directory on disk, and a flipped byte in a weight shard refused naming the file, the bytes
// and the tensor.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"
#include "tests/unit/engine/test_util.h"
#include "worker/data/provider.h"
#include "worker/engine/comm.h"
#include "worker/engine/hf_checkpoint.h"
#include "worker/objstore/object_store.h"

namespace tidal::engine {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tidal::testing::RunProcess;
using tidal::testing::S3Server;

// DeepSeek-V2-Lite's design at the tiny preset's width, random weights, in shards.
ModelConfig TinyDeepseek() {
  ModelConfig c = *PresetModelConfig("tiny");
  c.tie_word_embeddings = false;
  c.model_type = "deepseek_v2", c.num_key_value_heads = c.num_attention_heads;
  c.mla = {0, 32, 16, 16, 24, true};
  c.moe.n_routed_experts = 8, c.moe.num_experts_per_tok = 2, c.moe.n_shared_experts = 2;
  c.moe.moe_intermediate_size = 64, c.moe.first_k_dense_replace = 1;
  return c;
}

class ModelLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = S3Server::Start("models");
    ASSERT_TRUE(server_);
    env_ = {{"AWS_ACCESS_KEY_ID", server_->access_key()},
            {"AWS_SECRET_ACCESS_KEY", server_->secret_key()},
            {"AWS_ENDPOINT_URL_S3", server_->endpoint()},
            {"AWS_REGION", "us-east-1"}};
    auto s3 = objstore::S3OptionsFromEnv("", env_);
    ASSERT_TRUE(s3.ok()) << s3.status().message();
    s3_ = *s3;
    // The directory on disk, as transformers would shard it (~0.4 MB shards).
    local_ = dir_.path() + "/model";
    ASSERT_TRUE(
        WriteHfDirectory(local_, config_, testing::RandomBaseWeights(config_), 400'000).ok());
  }

  // tidal-prep --checksum-model on the local copy, then every file up to s3://models/<name>.
  void Upload(const std::string& name, bool checksums) {
    if (checksums) {
      // Blocks of 16 KiB: the tiny model's tensors are a few tens of KiB, and a rank reads
      // whole blocks.
      auto sum =
          RunProcess({TIDAL_PREP_BIN, "--checksum-model", local_, "--block-bytes", "16384"}, 120s);
      ASSERT_EQ(sum.exit_code, 0) << sum.err;
    }
    auto store = objstore::OpenObjectStore("s3://models/" + name, s3_);
    ASSERT_TRUE(store.ok()) << store.status().message();
    for (const auto& entry : fs::directory_iterator(local_)) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      ASSERT_TRUE((*store)->Put(entry.path().filename().string(), bytes.str()).ok());
    }
  }

  // The bytes of the local copy's safetensors shards.
  uint64_t WeightBytes() const {
    uint64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(local_))
      if (e.path().extension() == ".safetensors") bytes += fs::file_size(e.path());
    return bytes;
  }

  StatusOr<std::unique_ptr<HfCheckpoint>> OpenOnS3(const std::string& name) {
    data::StoreDataProvider provider(s3_);
    TIDAL_ASSIGN_OR_RETURN(auto files, provider.OpenModel("s3://models/" + name));
    return HfCheckpoint::Open(std::move(files));
  }

  // The base model's logits on a fixed batch (ZeRO-3, one rank).
  StatusOr<torch::Tensor> Logits(HfCheckpoint& hf) {
    DecoderModel model(hf.config(), LoraSpec{.target_modules = {}});
    auto comm = MakeSingleRankComm();
    ShardedParameters params(model, *comm, {3, torch::kCPU, torch::kFloat32});
    TIDAL_RETURN_IF_ERROR(params.Load(hf.Reader(model, 0)));
    torch::manual_seed(9);
    return testing::Logits(params, model, torch::randint(0, 256, {2, 16}, torch::kInt64));
  }

  ModelConfig config_ = TinyDeepseek();
  testing::TempDir dir_;
  std::unique_ptr<S3Server> server_;
  std::map<std::string, std::string> env_;
  objstore::S3Options s3_;
  std::string local_;
};

TEST_F(ModelLoadTest, AModelOnS3GivesTheLogitsOfTheSameDirectoryOnDiskVerifiedByRange) {
  Upload("v2", /*checksums=*/true);
  auto on_disk = HfCheckpoint::Open(local_);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status().message();
  auto on_s3 = OpenOnS3("v2");
  ASSERT_TRUE(on_s3.ok()) << on_s3.status().message();
  EXPECT_TRUE((*on_s3)->verified());
  auto expected = Logits(**on_disk);
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  auto actual = Logits(**on_s3);
  ASSERT_TRUE(actual.ok()) << actual.status().message();
  EXPECT_TRUE(torch::equal(*actual, *expected));
  // Every weight byte was fetched once, give or take the checksum blocks at tensor edges.
  const uint64_t weights = WeightBytes();
  EXPECT_GE((*on_s3)->BytesRead(), weights * 9 / 10);
  EXPECT_LE((*on_s3)->BytesRead(), weights * 2);
}

TEST_F(ModelLoadTest, AFlippedByteInAWeightShardIsRefusedNamingTheFileBytesAndTensor) {
  Upload("v2", /*checksums=*/true);
  // One byte of the second shard's data flipped on the server (a damaged upload).
  auto store = objstore::OpenObjectStore("s3://models/v2", s3_);
  ASSERT_TRUE(store.ok());
  const std::string shard = "model-00002-of-" + [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(local_))
      n += e.path().extension() == ".safetensors";
    char buf[8];
    std::snprintf(buf, sizeof buf, "%05d", n);
    return std::string(buf);
  }() + ".safetensors";
  auto bytes = (*store)->Get(shard);
  ASSERT_TRUE(bytes.ok()) << shard << ": " << bytes.status().message();
  std::string damaged = *bytes;
  damaged[damaged.size() - 100] ^= 0x10;
  ASSERT_TRUE((*store)->Put(shard, damaged).ok());

  auto hf = OpenOnS3("v2");
  ASSERT_TRUE(hf.ok()) << hf.status().message();  // the header is intact
  auto logits = Logits(**hf);
  ASSERT_FALSE(logits.ok());
  const std::string& message = logits.status().message();
  EXPECT_EQ(logits.status().code(), StatusCode::kDataLoss) << message;
  EXPECT_NE(message.find("s3://models/v2/" + shard), std::string::npos) << message;
  EXPECT_NE(message.find("do not match their checksum"), std::string::npos) << message;
  EXPECT_NE(message.find("reading tensor \"model."), std::string::npos) << message;

  // tidal-train on that uri stops before any step, saying the same.
  std::ofstream(dir_.path() + "/job.yaml")
      << "model: {uri: s3://models/v2}\n"
      << "dataset: {uri: " << TIDAL_SOURCE_DIR
      << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32, tokenizer: bytes,"
      << " preparedUri: " << dir_.path() << "/tokens}\n"
      << "lora: {rank: 4, alpha: 8, targetModules: [q_proj, kv_b_proj]}\n"
      << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 1,"
      << " learningRate: 5.0e-3, maxSteps: 2, seed: 2}\n";
  for (const auto& [k, v] : env_) setenv(k.c_str(), v.c_str(), 1);
  auto r =
      RunProcess({TIDAL_TRAIN_BIN, "--config", dir_.path() + "/job.yaml", "--nproc", "1"}, 300s);
  for (const auto& [k, v] : env_) unsetenv(k.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("do not match their checksum"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("\"loss\""), std::string::npos) << r.out;
}

// tidal-train at 2 ranks reads the model from s3:// by range: the losses of the same job on the
// directory on disk, and each rank fetches about half the weights (ZeRO-3 shards).
TEST_F(ModelLoadTest, TwoRanksTrainFromS3AsFromDiskEachReadingAboutHalf) {
  Upload("v2", /*checksums=*/true);
  auto job = [&](const std::string& uri, const std::string& name) {
    std::ofstream(dir_.path() + "/" + name)
        << "model: {uri: " << uri << "}\n"
        << "dataset: {uri: " << TIDAL_SOURCE_DIR
        << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32, tokenizer: bytes,"
        << " preparedUri: " << dir_.path() << "/tokens}\n"
        << "lora: {rank: 4, alpha: 8, targetModules: [q_proj, kv_a_proj_with_mqa, kv_b_proj]}\n"
        << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 1,"
        << " learningRate: 5.0e-3, maxSteps: 3, seed: 2}\n";
    return dir_.path() + "/" + name;
  };
  for (const auto& [k, v] : env_) setenv(k.c_str(), v.c_str(), 1);
  auto s3 = RunProcess(
      {TIDAL_TRAIN_BIN, "--config", job("s3://models/v2", "s3.yaml"), "--nproc", "2"}, 300s);
  auto disk =
      RunProcess({TIDAL_TRAIN_BIN, "--config", job(local_, "disk.yaml"), "--nproc", "2"}, 300s);
  for (const auto& [k, v] : env_) unsetenv(k.c_str());
  ASSERT_EQ(s3.exit_code, 0) << s3.err;
  ASSERT_EQ(disk.exit_code, 0) << disk.err;
  const auto losses = [](const std::string& out) {
    std::vector<double> l;
    for (const auto& j : testing::JsonLines(out, "")) l.push_back(j["loss"].get<double>());
    return l;
  };
  EXPECT_EQ(losses(s3.out), losses(disk.out));
  ASSERT_EQ(losses(s3.out).size(), 3u);
  const uint64_t weights = WeightBytes();
  const auto loaded = testing::JsonLines(s3.err, "model loaded");
  EXPECT_EQ(loaded.size(), 2u) << s3.err;
  for (const auto& j : loaded) {
    EXPECT_TRUE(j["verified"].get<bool>()) << j;
    const auto read = j["bytes_read"].get<uint64_t>();
    EXPECT_GT(read, weights / 4) << j;
    EXPECT_LT(read, weights * 3 / 4) << j;  // about half, not the whole model
    // Host memory as the kernel counts it is reported, the peak restarted for the load (the
    // figures themselves: bench/model_load.sh, on a model large enough to show them).
    EXPECT_GT(j["rss_before_load_bytes"].get<int64_t>(), 0) << j;
    EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0) << j;
    EXPECT_TRUE(j["peak_rss_since_load"].get<bool>()) << j;
  }
}

}  // namespace
}  // namespace tidal::engine
