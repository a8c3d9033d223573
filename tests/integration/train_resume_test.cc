// Checkpoints through tidal-train as a user runs it: save at one world size and ZeRO stage,
// resume at another with the same per-step losses; torn, corrupt and unwritable checkpoints
// fall back to the previous one or fail clearly without touching `latest`.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "api/checkpoint_interval.h"
#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/process.h"
#include "tests/integration/run_cache.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct TrainRun {
  ProcessResult result;
  std::map<int64_t, double> losses;  // step → loss
};

class TrainResumeTest : public ::testing::Test {
 protected:
  // One reference run for the suite: 30 steps at 3 ranks, ZeRO-3, a full checkpoint every 15
  // steps (15 and the final 30), in `ref_dir_/ref`: made once per build of tidal-train and
  // shared by the cases (each a process of its own under ctest), never written by them.
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "tidal-resume-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    // 12 sequences per step: whole micro-batches at 2, 3 and 4 ranks. LoRA dropout is on, so
    // equal losses also show the masks follow the step, not the rank layout.
    std::ofstream(dir_ + "/job.yaml")
        << "model: {preset: tiny, seed: 3}\n"
        << "dataset: {uri: " << TIDAL_SOURCE_DIR
        << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32}\n"
        << "lora: {rank: 4, alpha: 8, dropout: 0.1, targetModules: [q_proj, v_proj, up_proj]}\n"
        << "optimization:\n  zeroStage: 3\n  precision: fp32\n  globalBatchSize: 12\n"
        << "  microBatchSize: 1\n  learningRate: 2.0e-3\n  warmup: {steps: 5, adaptive: true}\n"
        << "  maxSteps: 30\n  seed: 1\n";
    std::ifstream job(dir_ + "/job.yaml");
    const std::string spec((std::istreambuf_iterator<char>(job)), std::istreambuf_iterator<char>());
    ref_ = new TrainRun;
    ref_dir_ = CachedRun(TIDAL_TEST_CACHE_DIR, "train-resume-reference",
                         WithFileIdentity(spec, TIDAL_TRAIN_BIN), [&](const std::string& into) {
                           *ref_ = Train(3, into + "/ref", {"--full-every", "15"});
                           std::ofstream(into + "/stdout") << ref_->result.out;
                           return ref_->result.exit_code == 0;
                         });
    if (!ref_dir_.empty() && ref_->losses.empty()) {  // made by an earlier case
      std::ifstream out(ref_dir_ + "/stdout");
      std::stringstream text;
      text << out.rdbuf();
      ref_->result.exit_code = 0;  // only a run that succeeded is kept
      ref_->result.out = text.str();
      ref_->losses = Losses(ref_->result.out);
    }
  }
  static void TearDownTestSuite() {
    delete ref_;
    fs::remove_all(dir_);
  }
  void SetUp() override {
    ASSERT_EQ(ref_->result.exit_code, 0) << ref_->result.err;
    ASSERT_EQ(ref_->losses.size(), 30u);
    ASSERT_TRUE(fs::exists(ref_dir_ + "/ref/step-00000015/manifest.json"));
    ASSERT_TRUE(fs::exists(ref_dir_ + "/ref/step-00000030/manifest.json"));
    work_ = dir_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(work_);
  }

  static TrainRun Train(int nproc, const std::string& ckpt, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        TIDAL_TRAIN_BIN,    "--config", dir_ + "/job.yaml", "--nproc", std::to_string(nproc),
        "--checkpoint-uri", ckpt};
    argv.insert(argv.end(), extra.begin(), extra.end());
    TrainRun run;
    run.result = RunProcess(argv, 300s);
    run.losses = Losses(run.result.out);
    return run;
  }
  static std::map<int64_t, double> Losses(const std::string& out) {
    std::map<int64_t, double> losses;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("step")) losses[j["step"]] = j["loss"];
    }
    return losses;
  }
  // A copy of the reference checkpoints holding only step 15.
  std::string CopyWithStep15(const std::string& name) {
    std::string to = work_ + "/" + name;
    fs::create_directories(to);
    fs::copy(ref_dir_ + "/ref/step-00000015", to + "/step-00000015", fs::copy_options::recursive);
    return to;
  }
  std::string CopyAll(const std::string& name) {
    std::string to = work_ + "/" + name;
    fs::copy(ref_dir_ + "/ref", to, fs::copy_options::recursive);
    return to;
  }
  // One bit of the byte 16 from the end of `file` flipped: a shard's data, which its checksum
  // then refuses.
  static void FlipAByteNearTheEnd(const std::string& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-16, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-16, std::ios::end);
    f.put(static_cast<char>(c ^ 0x20));
  }
  static void ExpectSameLosses(const TrainRun& resumed, int64_t from, int64_t to) {
    ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
    ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(to - from + 1)) << resumed.result.err;
    for (const auto& [step, loss] : resumed.losses) {
      ASSERT_GE(step, from);
      double want = ref_->losses.at(step);
      EXPECT_LE(std::abs(loss - want) / std::abs(want), 1e-5) << "step " << step;
    }
  }
  static std::string dir_, ref_dir_;
  static TrainRun* ref_;
  std::string work_;
};
std::string TrainResumeTest::dir_;
std::string TrainResumeTest::ref_dir_;
TrainRun* TrainResumeTest::ref_ = nullptr;

TEST_F(TrainResumeTest, FullCheckpointAtThreeRanksResumesAtTwoAndFourWithTheSameLosses) {
  for (int nproc : {2, 4}) {
    TrainRun resumed = Train(nproc, CopyWithStep15("at" + std::to_string(nproc)));
    EXPECT_NE(resumed.result.err.find("\"msg\":\"resumed\""), std::string::npos);
    ExpectSameLosses(resumed, 16, 30);
  }
}

TEST_F(TrainResumeTest, ZeroThreeCheckpointResumesAtZeroZeroAndBack) {
  // ZeRO-3 at 3 ranks → ZeRO-0 at 2 ranks, saving at 20 on the way.
  std::string zero0 = CopyWithStep15("zero0");
  TrainRun at0 = Train(2, zero0, {"--zero-stage", "0", "--full-every", "20"});
  ExpectSameLosses(at0, 16, 30);
  // …and that ZeRO-0 checkpoint (step 20, 2 ranks) back to ZeRO-3 at 4 ranks.
  std::string back = work_ + "/back";
  fs::create_directories(back);
  fs::copy(zero0 + "/step-00000020", back + "/step-00000020", fs::copy_options::recursive);
  TrainRun at3 = Train(4, back, {"--zero-stage", "3"});
  ExpectSameLosses(at3, 21, 30);
}

TEST_F(TrainResumeTest, ResumeFromAnotherUriContinuesTheCurveAndSavesOnlyWhereTold) {
  std::string from = CopyWithStep15("from"), to = work_ + "/to";
  TrainRun resumed = Train(2, to, {"--resume", from});
  ExpectSameLosses(resumed, 16, 30);
  EXPECT_TRUE(fs::exists(to + "/step-00000030/manifest.json"));
  EXPECT_TRUE(fs::exists(to + "/final/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(from + "/step-00000030")) << "the source is read, never written";

  // Asked for by name, an empty source is an error, not a fresh start.
  fs::create_directories(work_ + "/empty");
  TrainRun nothing = Train(2, work_ + "/to2", {"--resume", work_ + "/empty"});
  EXPECT_NE(nothing.result.exit_code, 0);
  EXPECT_TRUE(nothing.losses.empty());
  EXPECT_NE(nothing.result.err.find("--resume file://" + work_ + "/empty: no usable checkpoint"),
            std::string::npos)
      << nothing.result.err;
}

TEST_F(TrainResumeTest, TornAndCorruptCheckpointsFallBackToThePreviousOne) {
  // Step 30 torn (its manifest never written): resume from 15.
  std::string torn = CopyAll("torn");
  fs::remove(torn + "/step-00000030/manifest.json");
  TrainRun from_torn = Train(3, torn, {"--max-steps", "30"});
  ExpectSameLosses(from_torn, 16, 30);
  // Step 30 with one flipped byte in a shard's data: the read fails its checksum, every rank
  // falls back to 15, and the warning names the checkpoint.
  std::string corrupt = CopyAll("corrupt");
  FlipAByteNearTheEnd(corrupt + "/step-00000030/shard-00002-of-00003.safetensors");
  TrainRun from_corrupt = Train(2, corrupt);
  ExpectSameLosses(from_corrupt, 16, 30);
  EXPECT_NE(from_corrupt.result.err.find("checksum mismatch"), std::string::npos)
      << from_corrupt.result.err;
  EXPECT_NE(from_corrupt.result.err.find("step-00000030"), std::string::npos);
}

// The only checkpoint corrupt where one rank reads it (the end of the last shard: rank 1 of 2)
// while the other reads its part whole: no checkpoint is left to try, and every rank starts over
// from step 0 — the reference curve from its first step — never from a mix of what each read
// (found by the chaos test: a job went on at step 5 with one rank's state of step 5 and the
// other's initial one, its losses off the reference by up to 1%).
TEST_F(TrainResumeTest, TheOnlyCheckpointCorruptOnOneRankStartsEveryRankOverFromStepZero) {
  std::string only = CopyWithStep15("only");
  std::ofstream(only + "/latest") << "step-00000015\n";
  FlipAByteNearTheEnd(only + "/step-00000015/shard-00003-of-00003.safetensors");
  TrainRun run = Train(2, only);
  ExpectSameLosses(run, 1, 30);
  EXPECT_NE(run.result.err.find("checksum mismatch"), std::string::npos) << run.result.err;
  EXPECT_NE(run.result.err.find("no usable checkpoint left: starting over from step 0"),
            std::string::npos)
      << run.result.err;
}

TEST_F(TrainResumeTest, AnUnwritableStoreFailsTheSaveClearlyAndLeavesLatestAlone) {
  std::string blocked = CopyWithStep15("blocked");
  std::ofstream(blocked + "/latest") << "step-00000015\n";
  std::ofstream(blocked + "/step-00000020") << "a file where the step directory must go";
  TrainRun run = Train(2, blocked, {"--full-every", "20"});
  EXPECT_NE(run.result.exit_code, 0);
  EXPECT_NE(run.result.err.find("step-00000020"), std::string::npos) << run.result.err;
  std::ifstream latest(blocked + "/latest");
  std::string text((std::istreambuf_iterator<char>(latest)), {});
  EXPECT_EQ(text, "step-00000015\n");
  EXPECT_FALSE(fs::exists(blocked + "/step-00000020/manifest.json"));
}

// A real full disk: the checkpoint directory on a tmpfs (in a private mount namespace, so
// no privilege is needed) with room for the step-15 checkpoint and little more. The save at
// step 20 fails with the store's ENOSPC naming the step; `latest` still names step 15, no
// step-20 manifest exists, and step 15 still reads back whole (tidal-export verifies every
// chunk of its adapter).
TEST_F(TrainResumeTest, AFullDiskFailsTheSaveWithItsErrorAndLeavesTheLastCheckpointWhole) {
  if (RunProcess({"/usr/bin/unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"}, 30s)
          .exit_code != 0)
    GTEST_SKIP() << "no private mount namespace here (unshare -rm): cannot make a small disk";
  std::string source = CopyWithStep15("source");
  std::ofstream(source + "/latest") << "step-00000015\n";
  uintmax_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(source))
    if (entry.is_regular_file()) bytes += entry.file_size();
  // Room for step 15 and its `latest`, plus a quarter of a checkpoint: the next one cannot fit.
  const uintmax_t size = (bytes + bytes / 4) / 4096 * 4096 + 4 * 4096;
  const std::string disk = work_ + "/disk";
  fs::create_directories(disk);
  const std::string script =
      "set -u; mount -t tmpfs -o size=" + std::to_string(size) + " tmpfs '" + disk +
      "' || exit 90; cp -r '" + source + "' '" + disk + "/ck' || exit 91; '" + TIDAL_TRAIN_BIN +
      "' --config '" + dir_ + "/job.yaml' --nproc 2 --checkpoint-uri '" + disk +
      "/ck' --full-every 20 --max-steps 25; echo \"train-exit=$?\"; echo \"latest=$(cat '" + disk +
      "/ck/latest' 2>/dev/null)\"; ls '" + disk + "/ck/step-00000020' 2>/dev/null; '" +
      TIDAL_EXPORT_BIN + "' --checkpoint '" + disk + "/ck' --out '" + work_ +
      "/exported'; echo \"export-exit=$?\"";
  ProcessResult run = RunProcess({"/usr/bin/unshare", "-rm", "sh", "-c", script}, 300s);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("train-exit=1"), std::string::npos) << run.out << run.err;
  EXPECT_NE(run.err.find("No space left on device"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("step-00000020"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("latest=step-00000015"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("manifest.json"), std::string::npos) << "step 20 was committed";
  EXPECT_NE(run.out.find("export-exit=0"), std::string::npos) << run.out << run.err;
  EXPECT_NE(run.out.find("\"step\":15"), std::string::npos) << run.out;
}

// A checkpoint every step, written in the background: kill -9 of a rank at some point of
// that leaves at most a torn step directory; resuming picks the newest committed one and
// continues with the reference losses.
TEST_F(TrainResumeTest, KillNineOfARankDuringAsyncSavesLeavesTheLastCommittedOneLoadable) {
  std::string ckpt = work_ + "/killed";
  Process run({TIDAL_TRAIN_BIN, "--config", dir_ + "/job.yaml", "--nproc", "3", "--checkpoint-uri",
               ckpt, "--full-every", "1", "--keep", "30"});
  ASSERT_TRUE(run.WaitForOutput(
      [](const std::string& out) { return out.find("\"step\":8,") != std::string::npos; }, 120s));
  // The launcher's children are the ranks; kill one while saves are in flight every step.
  std::ifstream children("/proc/" + std::to_string(run.pid()) + "/task/" +
                         std::to_string(run.pid()) + "/children");
  pid_t rank = 0;
  ASSERT_TRUE(children >> rank) << "no rank processes found";
  ASSERT_EQ(::kill(rank, SIGKILL), 0);
  EXPECT_NE(run.Wait(60s).exit_code, 0);
  ASSERT_TRUE(fs::exists(ckpt + "/latest"));

  TrainRun resumed = Train(2, ckpt);
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  ASSERT_FALSE(resumed.losses.empty());
  int64_t first = resumed.losses.begin()->first;
  EXPECT_GE(first, 2);  // something was committed before the kill
  EXPECT_LE(first, 30);
  ExpectSameLosses(resumed, first, 30);
}

// The checkpoint path end to end on a real S3-protocol server that verifies SigV4: tidal-train
// at three ranks saves to s3:// on the reference curve; with its newest checkpoint deleted
// from the bucket, a run at two ranks resumes from the one before, on the reference curve.
TEST_F(TrainResumeTest, SavesToS3AndResumesFromItAtAnotherWorldSizeOnTheReferenceCurve) {
  auto server = S3Server::Start("ckpt");
  ASSERT_TRUE(server);
  const std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", server->access_key()},
                                                  {"AWS_SECRET_ACCESS_KEY", server->secret_key()},
                                                  {"AWS_ENDPOINT_URL", server->endpoint()},
                                                  {"AWS_REGION", "us-east-1"},
                                                  {"AWS_DEFAULT_REGION", "us-east-1"}};
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  TrainRun saved = Train(3, "s3://ckpt/run", {"--full-every", "15"});
  // boto3 deletes step 30, as an operator's lifecycle rule or a person might.
  ProcessResult deleted =
      RunProcess({TIDAL_PYTHON, "-c",
                  "import boto3, os\n"
                  "s3 = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'])\n"
                  "keys = [o['Key'] for o in s3.list_objects_v2(Bucket='ckpt',"
                  " Prefix='run/step-00000030/').get('Contents', [])]\n"
                  "for k in keys: s3.delete_object(Bucket='ckpt', Key=k)\n"
                  "print(len(keys))\n"},
                 120s);
  TrainRun resumed = Train(2, "s3://ckpt/run");
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  ExpectSameLosses(saved, 1, 30);
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_GT(std::stoi(deleted.out), 0) << "step 30 was not in the bucket";
  ExpectSameLosses(resumed, 16, 30);
}

// The config file is the spec: tidal-train saves where and when spec.checkpoint says, with no
// flag repeating it; flags override it; what the operator refuses there is refused here.
TEST_F(TrainResumeTest, TheFilesSpecCheckpointIsHonouredWithoutFlagsAndFlagsOverrideIt) {
  std::stringstream base;
  base << std::ifstream(dir_ + "/job.yaml").rdbuf();
  const std::string config = work_ + "/with-checkpoint.yaml";
  std::ofstream(config) << base.str() << "checkpoint: {uri: 'file://" << work_
                        << "/from-spec', fullEverySteps: 5, snapshotEverySteps: 0,"
                        << " keep: 4}\n";
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {TIDAL_TRAIN_BIN, "--config", config, "--nproc", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv, 300s);
  };
  ProcessResult spec_only = run({"--max-steps", "10"});
  ASSERT_EQ(spec_only.exit_code, 0) << spec_only.err;
  const std::string from_spec = work_ + "/from-spec";
  EXPECT_TRUE(fs::exists(from_spec + "/step-00000005/manifest.json"));
  EXPECT_TRUE(fs::exists(from_spec + "/step-00000010/manifest.json"));
  EXPECT_FALSE(fs::exists(from_spec + "/step-00000004"));

  const std::string flagged = work_ + "/flagged";
  ProcessResult overridden =
      run({"--max-steps", "8", "--checkpoint-uri", flagged, "--full-every", "4"});
  ASSERT_EQ(overridden.exit_code, 0) << overridden.err;
  EXPECT_TRUE(fs::exists(flagged + "/step-00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(flagged + "/step-00000008/manifest.json"));
  EXPECT_FALSE(fs::exists(flagged + "/step-00000005"));
  EXPECT_FALSE(fs::exists(from_spec + "/step-00000008")) << "the spec's uri was overridden";

  // A spec.checkpoint the operator would refuse is refused here too, naming the field.
  std::ofstream(config) << base.str() << "checkpoint: {uri: 'file:///tmp/x', keep: 0}\n";
  ProcessResult refused = run({"--max-steps", "1"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("spec.checkpoint.keep"), std::string::npos) << refused.err;
}

// spec.checkpoint.fullEverySteps auto through tidal-train at 2 ranks. The first plan, with no
// cost measured, is the least interval; each periodic full checkpoint's measured cost plans the
// next, exactly as api::PlanCheckpointInterval computes it from what rank 0 measured; the full
// checkpoints are committed at the planned steps (a rank that disagreed would fail the
// collective save); a resume plans at once from the cost and the training time its checkpoint
// carries.
TEST_F(TrainResumeTest, AnAutomaticIntervalIsPlannedFromEachCheckpointsMeasuredCostAndResumed) {
  std::stringstream base;
  base << std::ifstream(dir_ + "/job.yaml").rdbuf();
  const std::string config = work_ + "/auto.yaml";
  const std::string store = work_ + "/auto";
  // A 2 s prior MTBF makes Young's interval a few steps of the tiny preset, so that a short run
  // plans several times; keep: 100 leaves every checkpoint to be seen.
  std::ofstream(config) << base.str() << "checkpoint: {uri: 'file://" << store
                        << "', fullEverySteps: auto, expectedMTBF: 2s, minFullEverySteps: 2,"
                        << " maxFullEverySteps: 6, snapshotEverySteps: 0, keep: 100}\n";
  auto plans_of = [](const std::string& log) {
    std::vector<nlohmann::json> plans;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("msg", "") == "checkpoint interval planned") plans.push_back(j);
    }
    return plans;
  };
  ProcessResult first =
      RunProcess({TIDAL_TRAIN_BIN, "--config", config, "--nproc", "2", "--max-steps", "20"}, 300s);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto plans = plans_of(first.err);
  ASSERT_GE(plans.size(), 3u) << first.err;
  EXPECT_EQ(plans[0]["reason"], "Unmeasured");
  EXPECT_EQ(plans[0]["full_every_steps"], 2);
  EXPECT_EQ(plans[0]["next_full_step"], 2);
  EXPECT_EQ(plans[0]["failures"], 0);

  api::IntervalInputs in;
  in.spec = {2.0, 2, 6};
  std::set<int64_t> planned = {20};  // and the final one
  for (const auto& plan : plans) {
    SCOPED_TRACE(plan.dump());
    // Due at the planned step, or at the next boundary where the commit came after it.
    const int64_t due =
        std::max(plan["next_full_step"].get<int64_t>(), plan["planned_at_step"].get<int64_t>() + 1);
    if (due < 20) planned.insert(due);
    if (&plan == &plans[0]) continue;
    in.cost_seconds = plan["cost_seconds"];
    in.step_seconds = plan["step_seconds"];
    in.failures = plan["failures"];
    in.trained_seconds = plan["trained_seconds"];
    EXPECT_GT(in.cost_seconds, 0);
    EXPECT_GT(in.trained_seconds, 0);
    const api::IntervalPlan want = api::PlanCheckpointInterval(in);
    EXPECT_EQ(plan["full_every_steps"], want.steps);
    EXPECT_EQ(plan["reason"], api::ReasonName(want.reason));
    EXPECT_DOUBLE_EQ(plan["mtbf_seconds"].get<double>(), 2.0 + in.trained_seconds);
  }
  std::set<int64_t> committed;
  for (const auto& entry : fs::directory_iterator(store))
    if (fs::exists(entry.path() / "manifest.json"))
      committed.insert(std::stoll(entry.path().filename().string().substr(5)));
  EXPECT_EQ(committed, planned);

  ProcessResult resumed =
      RunProcess({TIDAL_TRAIN_BIN, "--config", config, "--nproc", "2", "--max-steps", "24"}, 300s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto again = plans_of(resumed.err);
  ASSERT_FALSE(again.empty()) << resumed.err;
  EXPECT_NE(again[0]["reason"], "Unmeasured") << again[0].dump();
  EXPECT_GT(again[0]["cost_seconds"].get<double>(), 0);
  EXPECT_GE(again[0]["trained_seconds"].get<double>(),
            plans.back()["trained_seconds"].get<double>());
}

}  // namespace
}  // namespace tidal::testing
