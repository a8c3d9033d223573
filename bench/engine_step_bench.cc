// bench/engine_step_bench.cc — times Trainer::Step for a preset on one rank (ZeRO-0, fp32,
// LoRA on all seven projections, r=16) with the batch shape bench/reference_step.py uses.
// Prints one JSON line; bench/step_time_vs_python.sh turns the pair into a ratio.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "worker/engine/trainer.h"

using namespace tidal::engine;

int main(int argc, char** argv) {
  std::string preset = "tiny";
  int64_t batch = 4, seq = 128, steps = 10, warmup = 2, rank = 16;
  int threads = 0;
  int stage = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    auto number = [&] { return std::stoll(value); };
    if (flag == "--preset")
      preset = value;
    else if (flag == "--batch")
      batch = number();
    else if (flag == "--seq")
      seq = number();
    else if (flag == "--steps")
      steps = number();
    else if (flag == "--warmup")
      warmup = number();
    else if (flag == "--rank")
      rank = number();
    else if (flag == "--threads")
      threads = static_cast<int>(number());
    else if (flag == "--zero-stage")
      stage = static_cast<int>(number());
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(threads);
  TrainConfig config;
  config.model.preset = preset;
  config.dataset.uri = std::string(TIDAL_SOURCE_DIR) + "/examples/data/sample.jsonl";
  config.dataset.max_seq_len = seq;
  config.lora = {rank,
                 2.0 * rank,
                 0.05,
                 {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  config.optimization.zero_stage = stage;
  config.optimization.precision = "fp32";
  config.optimization.global_batch_size = batch;
  config.optimization.micro_batch_size = batch;
  config.optimization.learning_rate = 1e-3;
  config.optimization.max_steps = warmup + steps;
  auto trainer = Trainer::Create(config, MakeSingleRankComm(), {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().message().c_str());
    return 1;
  }
  std::vector<double> times;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    auto r = (*trainer)->Step();
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      return 1;
    }
    if (s >= warmup) times.push_back(r->seconds);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf(
      "{\"impl\": \"tidal\", \"preset\": \"%s\", \"seconds_per_step\": %.6f, "
      "\"tokens_per_s\": %.1f, \"threads\": %d, \"zero_stage\": %d}\n",
      preset.c_str(), median, batch * seq / median, torch::get_num_threads(), stage);
  return 0;
}
