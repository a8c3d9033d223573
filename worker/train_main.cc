// worker/train_main.cc — `tidal-train`: a local multi-process LoRA fine-tune.
//   tidal-train --config FILE.yaml [--nproc N] [--max-steps K] [--out DIR] [--seed S]
//               [--checkpoint-uri URI [--full-every N] [--snapshot-every N] [--keep K]
//                [--no-resume]] [--resume URI] [--zero-stage S]
// Starts N ranks on loopback (the launcher hosts their rendezvous store), prints one JSON line
// per optimizer step on stdout, progress and logs on stderr, and a summary at the end.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "api/training_job.h"
#include "common/environment.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/yaml_json.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/data/provider.h"
#include "worker/engine/failpoints.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/run.h"
#include "worker/engine/store_server.h"
#include "worker/launcher.h"

namespace {

using tidal::Status;
using tidal::StatusOr;

constexpr const char* kUsage =
    "usage: tidal-train --config FILE.yaml [--nproc N] [--max-steps K] [--out DIR] [--seed S]\n"
    "  --config     a TrainingJob spec (or a whole TrainingJob manifest) in YAML or JSON\n"
    "  --nproc      local ranks to run as child processes (default 1)\n"
    "  --max-steps  stop after K optimizer steps (default spec.optimization.maxSteps)\n"
    "  --out        write per-rank summaries and the trained LoRA weights there\n"
    "  --seed       seed for initialisation, data order and dropout (default from the spec)\n"
    "  --zero-stage ZeRO stage 0-3 (default spec.optimization.zeroStage)\n"
    "  --checkpoint-uri  file:///dir, /dir or s3://bucket/prefix: resume from the newest\n"
    "               usable checkpoint there, save into it (S3 settings from AWS_* env vars);\n"
    "               default spec.checkpoint.uri\n"
    "  --full-every N      a full checkpoint (weights + optimizer) every N steps, or auto:\n"
    "               Young's interval from the measured checkpoint cost and\n"
    "               spec.checkpoint.expectedMTBF (default spec.checkpoint.fullEverySteps)\n"
    "  --snapshot-every N  a snapshot (weights + trainer state) every N steps\n"
    "               (default spec.checkpoint.snapshotEverySteps)\n"
    "  --keep K     newest full checkpoints kept (default spec.checkpoint.keep, else 3)\n"
    "  --no-resume  start from scratch even when the checkpoint URI holds checkpoints\n"
    "  --resume URI resume from the newest usable checkpoint in URI (an error when there is\n"
    "               none); saves still go to --checkpoint-uri, if given\n"
    "  --dry-run    print the model's parameters, trainable parameters and what one rank needs\n"
    "               in memory at --nproc ranks (ZeRO stage, micro-batch, maxSeqLen of the\n"
    "               spec) as JSON, and exit without training\n";

struct Args {
  std::string config;
  int nproc = 1;
  std::optional<int64_t> max_steps;
  std::string out;
  std::optional<uint64_t> seed;
  std::optional<int> zero_stage;
  // Override spec.checkpoint's uri, fullEverySteps, snapshotEverySteps and keep when given.
  std::optional<std::string> checkpoint_uri;
  std::string resume_uri;
  std::optional<int64_t> full_every, snapshot_every;
  bool full_every_auto = false;  // --full-every auto
  std::optional<int> keep;
  bool resume = true;
  bool dry_run = false;
  // Set by the launcher for its children.
  std::optional<int> rank;
  int world_size = 1;
  std::string store_host;
  int store_port = 0;
};

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return tidal::InvalidArgument("help");
    if (flag == "--dry-run") {
      args.dry_run = true;
      continue;
    }
    if (flag == "--no-resume") {
      args.resume = false;
      continue;
    }
    if (i + 1 >= argc) return tidal::InvalidArgument(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "--config") {
      args.config = value;
    } else if (flag == "--nproc") {
      TIDAL_ASSIGN_OR_RETURN(args.nproc, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--max-steps") {
      TIDAL_ASSIGN_OR_RETURN(args.max_steps, tidal::ParseIntFlag<int64_t>(flag, value, 1));
    } else if (flag == "--out") {
      args.out = value;
    } else if (flag == "--seed") {
      TIDAL_ASSIGN_OR_RETURN(args.seed, tidal::ParseIntFlag<uint64_t>(flag, value, 0));
    } else if (flag == "--zero-stage") {
      TIDAL_ASSIGN_OR_RETURN(int stage, tidal::ParseIntFlag<int>(flag, value, 0));
      if (stage > 3) return tidal::InvalidArgument("--zero-stage: expected 0-3, got " + value);
      args.zero_stage = stage;
    } else if (flag == "--checkpoint-uri") {
      args.checkpoint_uri = value;
    } else if (flag == "--resume") {
      args.resume_uri = value;
    } else if (flag == "--full-every" && value == "auto") {
      args.full_every_auto = true;
      args.full_every.reset();
    } else if (flag == "--full-every") {
      TIDAL_ASSIGN_OR_RETURN(args.full_every, tidal::ParseIntFlag<int64_t>(flag, value, 0));
      args.full_every_auto = false;
    } else if (flag == "--snapshot-every") {
      TIDAL_ASSIGN_OR_RETURN(args.snapshot_every, tidal::ParseIntFlag<int64_t>(flag, value, 0));
    } else if (flag == "--keep") {
      TIDAL_ASSIGN_OR_RETURN(args.keep, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--rank") {
      TIDAL_ASSIGN_OR_RETURN(args.rank, tidal::ParseIntFlag<int>(flag, value, 0));
    } else if (flag == "--world-size") {
      TIDAL_ASSIGN_OR_RETURN(args.world_size, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--store") {
      auto colon = value.rfind(':');
      if (colon == std::string::npos) return tidal::InvalidArgument("--store: expected HOST:PORT");
      args.store_host = value.substr(0, colon);
      TIDAL_ASSIGN_OR_RETURN(args.store_port,
                             tidal::ParseIntFlag<int>(flag, value.substr(colon + 1), 1));
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (args.config.empty()) return tidal::InvalidArgument("--config is required");
  if (!args.resume_uri.empty() && !args.resume)
    return tidal::InvalidArgument("--resume and --no-resume contradict each other");
  return args;
}

struct Job {
  tidal::engine::TrainConfig config;
  tidal::checkpoint::CheckpointPolicy policy;
};

// The config file is the spec, validated as the operator and tidal-worker validate it
// (spec.checkpoint included); flags only override it.
StatusOr<Job> LoadJob(const Args& args) {
  TIDAL_ASSIGN_OR_RETURN(auto json, tidal::ReadYamlFile(args.config));
  if (!json.is_object()) return tidal::InvalidArgument(args.config + ": expected a mapping");
  const nlohmann::json spec = json.contains("spec") ? json["spec"] : json;
  auto parsed = tidal::api::ParseTrainingJobSpec(spec);
  if (!parsed.ok()) return parsed.status().WithContext(args.config);
  const std::string base = std::filesystem::absolute(args.config).parent_path().string();
  auto config = tidal::engine::TrainConfigFromJson(json, base);
  if (!config.ok()) return config.status().WithContext(args.config);
  Job job{std::move(*config), {}};
  if (args.seed) {
    job.config.optimization.seed = *args.seed;
    job.config.model.init_seed = *args.seed;
  }
  if (args.zero_stage) job.config.optimization.zero_stage = *args.zero_stage;

  // spec.checkpoint, when the file has one (its defaults as the operator's); else no saves.
  auto& p = job.policy;
  if (spec.is_object() && spec.contains("checkpoint")) {
    p.uri = parsed->checkpoint.uri;
    p.full_every = parsed->checkpoint.full_every_steps;
    if (parsed->checkpoint.full_every_auto) p.auto_full = parsed->checkpoint.auto_interval;
    p.snapshot_every = parsed->checkpoint.snapshot_every_steps;
    p.keep = static_cast<int>(parsed->checkpoint.keep);
    p.start_from_uri = parsed->checkpoint.resume_from;  // --resume, from the spec
  }
  if (args.checkpoint_uri) p.uri = *args.checkpoint_uri;
  if (args.full_every) {
    p.full_every = *args.full_every;
    p.auto_full.reset();
  }
  if (args.full_every_auto) {
    p.full_every = 0;
    p.auto_full = parsed->checkpoint.auto_interval;  // the spec's bounds, or their defaults
  }
  if (args.snapshot_every) p.snapshot_every = *args.snapshot_every;
  if (args.keep) p.keep = *args.keep;
  p.resume_uri = args.resume_uri;
  p.resume = args.resume;
  if (p.uri.empty() && (args.full_every || args.full_every_auto || args.snapshot_every))
    return tidal::InvalidArgument(
        "--full-every/--snapshot-every: need --checkpoint-uri or spec.checkpoint.uri");
  return job;
}

// Reads rank 0's summary and prints what happened, for people (stderr).
void PrintSummary(const std::string& out_dir, double wall_seconds) try {
  std::ifstream in(out_dir + "/rank-0.json");
  if (!in) return;
  auto s = nlohmann::json::parse(in, nullptr, false);
  if (s.is_discarded() || !s.contains("losses") || !s["losses"].is_array() || s["losses"].empty())
    return;
  const auto& losses = s["losses"];
  std::fprintf(stderr,
               "\nsummary: %lld steps on %d ranks (ZeRO-%d) in %.1f s\n"
               "  loss %.4f -> %.4f (%.0f%% of the first step)\n"
               "  trainable parameters %lld; parameter bytes resident on rank 0: %lld of %lld\n"
               "  LoRA weights: %s/lora_weights.safetensors\n",
               static_cast<long long>(s["steps"].get<int64_t>()), s["world_size"].get<int>(),
               s["zero_stage"].get<int>(), wall_seconds, losses.front().get<double>(),
               losses.back().get<double>(),
               100.0 * losses.back().get<double>() / losses.front().get<double>(),
               static_cast<long long>(s["trainable_params"].get<int64_t>()),
               static_cast<long long>(s["resident_param_bytes"].get<int64_t>()),
               static_cast<long long>(s["total_param_bytes"].get<int64_t>()), out_dir.c_str());
} catch (const nlohmann::json::exception& e) {
  std::fprintf(stderr, "tidal-train: cannot summarise %s/rank-0.json: %s\n", out_dir.c_str(),
               e.what());
}

int Fail(const Status& status, const char* who) {
  std::fprintf(stderr, "tidal-train: %s%s\n", who, status.message().c_str());
  return status.code() == tidal::StatusCode::kInvalidArgument ? 2 : 1;
}

// --dry-run: the model's config.json (or preset) and the memory one rank needs at --nproc.
Status DryRun(const tidal::engine::TrainConfig& config, int world_size) {
  tidal::engine::ModelConfig model;
  if (!config.model.preset.empty()) {
    TIDAL_ASSIGN_OR_RETURN(model, tidal::engine::PresetModelConfig(config.model.preset));
  } else {
    tidal::objstore::S3Options s3;
    if (config.model.uri.rfind("s3://", 0) == 0) {
      TIDAL_ASSIGN_OR_RETURN(s3, tidal::objstore::S3OptionsFromEnv("", tidal::EnvironmentMap()));
    }
    tidal::data::StoreDataProvider provider(s3);
    TIDAL_ASSIGN_OR_RETURN(auto files, provider.OpenModel(config.model.uri));
    TIDAL_ASSIGN_OR_RETURN(std::string text, files->Read("config.json"));
    auto json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded())
      return tidal::InvalidArgument(files->Describe("config.json") + ": not valid JSON");
    TIDAL_ASSIGN_OR_RETURN(model, tidal::engine::ModelConfigFromHfJson(json));
  }
  TIDAL_RETURN_IF_ERROR(tidal::engine::CheckLoraFitsModel(config.lora, model));
  TIDAL_RETURN_IF_ERROR(config.ValidateForWorldSize(world_size));
  const auto& opt = config.optimization;
  const auto plan = tidal::engine::PlanMemory(model, config.lora, opt.zero_stage, world_size,
                                              opt.micro_batch_size, config.dataset.max_seq_len,
                                              opt.precision == "fp32" ? 4 : 2);
  nlohmann::json out = plan.ToJson();
  out["model_type"] = model.model_type;
  out["precision"] = opt.precision;
  std::printf("%s\n", out.dump().c_str());
  return tidal::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    if (args.status().message() != "help")
      std::fprintf(stderr, "tidal-train: %s\n", args.status().message().c_str());
    std::fputs(kUsage, stderr);
    return args.status().message() == "help" ? 0 : 2;
  }
  // The test hooks (worker/engine/failpoints.h), checked whether or not this run reads them: a
  // misspelt one would run the job without it.
  if (auto failpoints = tidal::engine::Failpoints::FromProcess(); !failpoints.ok())
    return Fail(failpoints.status(), "");
  auto job = LoadJob(*args);
  if (!job.ok()) return Fail(job.status(), "");
  if (args->dry_run) {
    Status planned = DryRun(job->config, args->nproc);
    return planned.ok() ? 0 : Fail(planned, "--dry-run: ");
  }
  const tidal::engine::TrainConfig* config = &job->config;
  const tidal::checkpoint::CheckpointPolicy& policy = job->policy;

  tidal::engine::RankLaunch rank_launch;
  rank_launch.max_steps = args->max_steps;
  rank_launch.out_dir = args->out;
  {
    tidal::objstore::S3Options data_s3;
    if (config->dataset.uri.rfind("s3://", 0) == 0 || config->model.uri.rfind("s3://", 0) == 0 ||
        config->dataset.prepared_uri.rfind("s3://", 0) == 0) {
      auto from_env = tidal::objstore::S3OptionsFromEnv("", tidal::EnvironmentMap());
      if (!from_env.ok()) return Fail(from_env.status(), "");
      data_s3 = *from_env;
    }
    auto provider = std::make_shared<tidal::data::StoreDataProvider>(data_s3);
    provider->set_progress(tidal::data::LogPrepProgress());
    rank_launch.data = provider;
  }
  std::unique_ptr<tidal::engine::TrainingHooks> hooks;
  const bool checkpoints = !policy.uri.empty() || !policy.resume_uri.empty();
  if (checkpoints && (args->rank || args->nproc == 1)) {
    tidal::objstore::S3Options s3;
    if (policy.uri.rfind("s3://", 0) == 0 ||
        policy.resume_uri.rfind("s3://", 0) == 0) {  // credentials only matter for S3
      auto from_env = tidal::objstore::S3OptionsFromEnv("", tidal::EnvironmentMap());
      if (!from_env.ok()) return Fail(from_env.status(), "");
      s3 = *from_env;
    }
    auto made = tidal::checkpoint::MakeCheckpointHooks(policy, s3);
    if (!made.ok()) return Fail(made.status(), "");
    hooks = std::move(*made);
    rank_launch.hooks = hooks.get();
  }
  if (args->rank) {  // a child started by the launcher below
    rank_launch.rank = *args->rank;
    rank_launch.world_size = args->world_size;
    rank_launch.store_host = args->store_host;
    rank_launch.store_port = args->store_port;
    Status status = tidal::engine::RunRank(*config, rank_launch);
    if (!status.ok()) {
      tidal::LogError("rank failed", {{"error", status.message()}});
      return 1;
    }
    return 0;
  }

  if (Status valid = config->ValidateForWorldSize(args->nproc); !valid.ok()) return Fail(valid, "");
  const auto start = std::chrono::steady_clock::now();
  tidal::Logger::Get().SetContext({config->name, -1, 0});
  // The data first, once, before any rank starts: tidal-prep's tokenization when
  // spec.dataset.uri names JSONL (a no-op when its store exists), and the tokenizer checks.
  if (Status prepared = rank_launch.data->Prepare(*config); !prepared.ok())
    return Fail(prepared, "");
  Status status;
  if (args->nproc == 1) {
    status = tidal::engine::RunRank(*config, rank_launch);
  } else {
    auto store = tidal::engine::StoreServer::Start("127.0.0.1");
    if (!store.ok()) return Fail(store.status(), "");
    tidal::LocalLaunch launch;
    launch.executable = std::filesystem::canonical("/proc/self/exe").string();
    launch.args = {"--config", args->config};
    if (args->max_steps)
      launch.args.insert(launch.args.end(), {"--max-steps", std::to_string(*args->max_steps)});
    if (!args->out.empty()) launch.args.insert(launch.args.end(), {"--out", args->out});
    if (args->seed) launch.args.insert(launch.args.end(), {"--seed", std::to_string(*args->seed)});
    if (args->zero_stage)
      launch.args.insert(launch.args.end(), {"--zero-stage", std::to_string(*args->zero_stage)});
    // The children read the same file; the policy resolved here goes with them as flags.
    if (!policy.uri.empty())
      launch.args.insert(
          launch.args.end(),
          {"--checkpoint-uri", policy.uri, "--full-every",
           policy.auto_full ? std::string("auto") : std::to_string(policy.full_every),
           "--snapshot-every", std::to_string(policy.snapshot_every), "--keep",
           std::to_string(policy.keep)});
    if (!args->resume) launch.args.push_back("--no-resume");
    if (!args->resume_uri.empty())
      launch.args.insert(launch.args.end(), {"--resume", args->resume_uri});
    launch.nproc = args->nproc;
    launch.store_port = (*store)->port();
    status = tidal::RunLocalRanks(launch);
  }
  if (!status.ok()) return Fail(status, "");
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!args->out.empty()) PrintSummary(args->out, wall);
  return 0;
}
