// worker/engine/run.cc — one rank from start to finish: join the process group, build the
// trainer, print one JSON line per step (rank 0), progress with ETA on stderr, and a summary.
#include "worker/engine/run.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "common/strings.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/torch_compat.h"
#include "worker/engine/trainer.h"

namespace tidal::engine {
namespace {

void PrintStepLine(const StepRecord& r) {
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"world_size", r.world_size}};
  if (r.skipped) line["skipped"] = true;
  std::string text = line.dump();
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

Status WriteJson(const std::string& path, const nlohmann::json& json) {
  std::ofstream out(path + ".tmp");
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return Unavailable("cannot write " + path);
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return Unavailable("cannot write " + path + ": " + ec.message());
  return OkStatus();
}

Status Train(const TrainConfig& config, const RankLaunch& launch) {
  const bool cuda = compat::CudaAvailable();
  ProcessGroupOptions group;
  group.store_host = launch.store_host;
  group.store_port = launch.store_port;
  group.rank = launch.rank;
  group.world_size = launch.world_size;
  group.use_cuda = cuda;
  TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, ConnectProcessGroup(group));
  TrainerOptions options;
  options.max_steps = launch.max_steps;
  if (cuda) options.device = torch::Device(torch::kCUDA, launch.rank % torch::cuda::device_count());
  TIDAL_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(config, std::move(comm), options));

  const bool leader = launch.rank == 0;
  const bool summarize = !launch.out_dir.empty();
  const uint64_t base_before = summarize ? trainer->parameters().FrozenChecksum() : 0;
  const int64_t total = trainer->max_steps();
  const int64_t progress_every = std::max<int64_t>(1, total / 20);
  std::vector<double> losses;
  double seconds = 0;
  if (launch.hooks) TIDAL_RETURN_IF_ERROR(launch.hooks->OnStart(*trainer));
  const int64_t first_step = trainer->step();
  while (trainer->step() < total) {
    TIDAL_ASSIGN_OR_RETURN(StepRecord record, trainer->Step());
    losses.push_back(record.loss);
    seconds += record.seconds;
    if (launch.hooks) TIDAL_RETURN_IF_ERROR(launch.hooks->AfterStep(*trainer));
    if (!leader) continue;
    PrintStepLine(record);
    if (record.step % progress_every == 0 || record.step == total) {
      const double eta = seconds / static_cast<double>(record.step - first_step) *
                         static_cast<double>(total - record.step);
      LogInfo("progress", {{"step", record.step},
                           {"max_steps", total},
                           {"percent", std::round(1000.0 * record.step / total) / 10},
                           {"loss", record.loss},
                           {"lr", record.lr},
                           {"tokens_per_s", std::round(record.tokens_per_s)},
                           {"eta_s", std::round(eta)}});
    }
  }
  if (launch.hooks) TIDAL_RETURN_IF_ERROR(launch.hooks->OnFinish(*trainer));
  if (!summarize) return OkStatus();

  std::error_code ec;
  std::filesystem::create_directories(launch.out_dir, ec);
  if (ec) return Unavailable("--out: cannot create " + launch.out_dir + ": " + ec.message());
  auto& params = trainer->parameters();
  TIDAL_ASSIGN_OR_RETURN(auto adapters, params.GatherTrainable());  // collective: every rank
  nlohmann::json summary = {{"rank", launch.rank},
                            {"world_size", launch.world_size},
                            {"zero_stage", params.options().stage},
                            {"steps", trainer->step()},
                            {"losses", losses},
                            {"resident_param_bytes", params.ResidentParameterBytes()},
                            {"total_param_bytes", params.TotalParameterBytes()},
                            {"largest_block_bytes", params.LargestBlockBytes()},
                            {"optimizer_state_bytes", trainer->optimizer().StateBytes()},
                            {"trainable_params", params.TrainableParameterCount()},
                            {"base_checksum_before", std::to_string(base_before)},
                            {"base_checksum_after", std::to_string(params.FrozenChecksum())},
                            {"train_seconds", seconds}};
  TIDAL_RETURN_IF_ERROR(
      WriteJson(launch.out_dir + "/rank-" + std::to_string(launch.rank) + ".json", summary));
  if (leader) {
    TIDAL_RETURN_IF_ERROR(WriteSafetensors(launch.out_dir + "/lora_weights.safetensors", adapters,
                                           {{"format", "pt"}}));
  }
  return OkStatus();
}

}  // namespace

Status RunRank(const TrainConfig& config, const RankLaunch& launch) {
  Logger::Get().SetContext({config.name, launch.rank, 0});
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(launch.intra_op_threads > 0
                             ? launch.intra_op_threads
                             : std::max(1, cores / std::max(1, launch.world_size)));
  try {
    return Train(config, launch);
  } catch (const std::exception& e) {
    // LibTorch reports shape and device mistakes by throwing; they end here as a Status.
    const std::string msg = FirstLine(e.what());
    return Internal("rank " + std::to_string(launch.rank) + ": " + msg);
  }
}

}  // namespace tidal::engine
