// worker/engine/run.cc — one local rank from start to finish over a Session (as tidal-worker
// runs one): print one JSON line per step (rank 0), progress with ETA on stderr, a summary.
#include "worker/engine/run.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "common/strings.h"
#include "worker/engine/numa.h"
#include "worker/engine/session.h"
#include "worker/engine/torch_compat.h"

namespace tidal::engine {
namespace {

void PrintStepLine(const StepRecord& r) {
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"seconds", r.seconds},
                         {"data_wait_s", r.data_wait_seconds},
                         {"world_size", r.world_size},
                         {"micro_batch", r.micro_batch}};
  if (r.peak_memory_bytes >= 0) line["peak_memory_bytes"] = r.peak_memory_bytes;
  if (r.skipped) line["skipped"] = true;
  line["gradient_bytes"] = r.gradient_bytes;
  if (r.compressed) {
    line["compressed"] = true;
    line["compress_s"] = r.compress_seconds;
    line["exchange_wait_s"] = r.exchange_wait_seconds;
  }
  if (!r.expert_tokens.empty()) {  // load balance: per MoE layer, and per expert over layers
    nlohmann::json imbalance = nlohmann::json::array();
    for (double x : r.MoeImbalance()) imbalance.push_back(std::round(x * 1000) / 1000);
    std::vector<int64_t> per_expert(r.expert_tokens[0].size(), 0);
    for (const auto& layer : r.expert_tokens)
      for (size_t e = 0; e < layer.size(); ++e) per_expert[e] += layer[e];
    line["moe_imbalance"] = imbalance;
    line["expert_tokens"] = per_expert;
  }
  std::string text = line.dump();
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// tidal-train's loop over the same Session tidal-worker's control runtime drives: join, resume
// (hooks), step until the last, scheduled saves, final save, and the summary.
Status Train(const TrainConfig& config, const RankLaunch& launch) {
  Membership membership;
  membership.rank = launch.rank;
  membership.world_size = launch.world_size;
  membership.store_host = launch.store_host;
  membership.store_port = launch.store_port;
  membership.rank0_hosts_store = false;  // tidal-train's launcher hosts it
  SessionOptions options;
  options.data = launch.data;
  options.max_steps = launch.max_steps;
  // Local ranks share the machine: each gets its part of the cores and, with CUDA, a GPU.
  const int cores = numa::UsableCpus();  // a cpuset or NUMA binding: only those
  options.intra_op_threads = launch.intra_op_threads > 0
                                 ? launch.intra_op_threads
                                 : std::max(1, cores / std::max(1, launch.world_size));
  if (compat::CudaAvailable())
    options.cuda_device = launch.rank % static_cast<int>(torch::cuda::device_count());
  TIDAL_ASSIGN_OR_RETURN(auto session, Session::Join(config, membership, options));

  const bool leader = launch.rank == 0;
  const bool summarize = !launch.out_dir.empty();
  RunSummary run;
  if (summarize) run.base_checksum_before = session->FrozenChecksum();
  const int64_t total = session->max_steps();
  const int64_t progress_every = std::max<int64_t>(1, total / 20);
  if (launch.hooks) TIDAL_RETURN_IF_ERROR(session->Start(*launch.hooks));
  const int64_t first_step = session->step();
  while (session->step() < total) {
    TIDAL_ASSIGN_OR_RETURN(StepRecord record, session->Step());
    run.losses.push_back(record.loss);
    run.train_seconds += record.seconds;
    if (launch.hooks) TIDAL_RETURN_IF_ERROR(session->After(*launch.hooks));
    if (!leader) continue;
    PrintStepLine(record);
    if (record.step % progress_every == 0 || record.step == total) {
      const double eta = run.train_seconds / static_cast<double>(record.step - first_step) *
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
  if (launch.hooks) TIDAL_RETURN_IF_ERROR(session->Finish(*launch.hooks));
  if (summarize) TIDAL_RETURN_IF_ERROR(session->WriteSummary(run, launch.out_dir));
  return OkStatus();
}

}  // namespace

Status RunRank(const TrainConfig& config, const RankLaunch& launch) {
  Logger::Get().SetContext({config.name, launch.rank, 0});
  try {
    return Train(config, launch);
  } catch (const std::exception& e) {
    // LibTorch reports shape and device mistakes by throwing; they end here as a Status.
    const std::string msg = FirstLine(e.what());
    return Internal("rank " + std::to_string(launch.rank) + ": " + msg);
  }
}

}  // namespace tidal::engine
