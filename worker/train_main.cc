// worker/train_main.cc — `tidal-train`: a local multi-process LoRA fine-tune.
//   tidal-train --config FILE.yaml [--nproc N] [--max-steps K] [--out DIR] [--seed S]
// Starts N ranks on loopback (the launcher hosts their rendezvous store), prints one JSON line
// per optimizer step on stdout, progress and logs on stderr, and a summary at the end.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "common/log.h"
#include "common/yaml_json.h"
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
    "  --seed       seed for initialisation, data order and dropout (default from the spec)\n";

struct Args {
  std::string config;
  int nproc = 1;
  std::optional<int64_t> max_steps;
  std::string out;
  std::optional<uint64_t> seed;
  // Set by the launcher for its children.
  std::optional<int> rank;
  int world_size = 1;
  std::string store_host;
  int store_port = 0;
};

template <typename T>
StatusOr<T> ParseNumber(const std::string& flag, const std::string& text, T min) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min)
    return tidal::InvalidArgument(flag + ": expected an integer >= " + std::to_string(min) +
                                  ", got \"" + text + "\"");
  return value;
}

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return tidal::InvalidArgument("help");
    if (i + 1 >= argc) return tidal::InvalidArgument(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "--config") {
      args.config = value;
    } else if (flag == "--nproc") {
      TIDAL_ASSIGN_OR_RETURN(args.nproc, ParseNumber<int>(flag, value, 1));
    } else if (flag == "--max-steps") {
      TIDAL_ASSIGN_OR_RETURN(args.max_steps, ParseNumber<int64_t>(flag, value, 1));
    } else if (flag == "--out") {
      args.out = value;
    } else if (flag == "--seed") {
      TIDAL_ASSIGN_OR_RETURN(args.seed, ParseNumber<uint64_t>(flag, value, 0));
    } else if (flag == "--rank") {
      TIDAL_ASSIGN_OR_RETURN(args.rank, ParseNumber<int>(flag, value, 0));
    } else if (flag == "--world-size") {
      TIDAL_ASSIGN_OR_RETURN(args.world_size, ParseNumber<int>(flag, value, 1));
    } else if (flag == "--store") {
      auto colon = value.rfind(':');
      if (colon == std::string::npos) return tidal::InvalidArgument("--store: expected HOST:PORT");
      args.store_host = value.substr(0, colon);
      TIDAL_ASSIGN_OR_RETURN(args.store_port, ParseNumber<int>(flag, value.substr(colon + 1), 1));
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (args.config.empty()) return tidal::InvalidArgument("--config is required");
  return args;
}

StatusOr<tidal::engine::TrainConfig> LoadConfig(const Args& args) {
  TIDAL_ASSIGN_OR_RETURN(auto json, tidal::ReadYamlFile(args.config));
  const std::string base = std::filesystem::absolute(args.config).parent_path().string();
  auto config = tidal::engine::TrainConfigFromJson(json, base);
  if (!config.ok()) return config.status().WithContext(args.config);
  if (args.seed) {
    config->optimization.seed = *args.seed;
    config->model.init_seed = *args.seed;
  }
  return config;
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

}  // namespace

int main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    if (args.status().message() != "help")
      std::fprintf(stderr, "tidal-train: %s\n", args.status().message().c_str());
    std::fputs(kUsage, stderr);
    return args.status().message() == "help" ? 0 : 2;
  }
  auto config = LoadConfig(*args);
  if (!config.ok()) return Fail(config.status(), "");

  tidal::engine::RankLaunch rank_launch;
  rank_launch.max_steps = args->max_steps;
  rank_launch.out_dir = args->out;
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
