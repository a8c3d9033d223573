// bench/engine_step_bench.cc — times Trainer::Step for a preset on one rank (ZeRO-0 by
// default), with the batch shape, precision and LoRA targets bench/hf_reference_step.py uses
// for transformers + PEFT. Prints one JSON line: step time, tokens/s, the model's shape (for
// MFU), and peak memory (CUDA: the caching allocator's peak; CPU: the process's max RSS).
// bench/step_time_vs_python.sh and bench/gpu.sh turn pairs of lines into ratios.
// Issue 25's costs on the same engine, in the same line: the engine built for a generation
// (Trainer::Create: model, data, every base weight loaded) against the engine kept into the
// next one (LeaveGroup + JoinGroup: the base weights this rank holds copied, nothing read),
// `--generations N` times; and a buddy copy's cost to the training thread (the trainable and
// optimizer shards copied to host memory) and to its writer, after each of the timed steps,
// against the step time (`--buddy 1`).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "worker/checkpoint/trainer_checkpoint.h"
#include "worker/data/provider.h"
#include "worker/engine/comm.h"
#include "worker/engine/torch_compat.h"
#include "worker/engine/trainer.h"
#ifdef TIDAL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace tidal::engine;
using tidal::Status;
using tidal::StatusOr;
namespace data = tidal::data;

namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t PeakBytes(const torch::Device& device) {
#ifdef TIDAL_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "tiny", device_name = "cpu", precision = "fp32",
              data = std::string(TIDAL_SOURCE_DIR) + "/examples/data/sample.jsonl";
  std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  int64_t batch = 4, seq = 128, steps = 10, warmup = 2, rank = 16;
  int threads = 0;
  int stage = 0;
  int64_t generations = 0;
  bool buddy = false;
  std::string hf_config_out;  // set: write the preset's config.json there and exit
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: missing value\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[i + 1];
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
    else if (flag == "--device")
      device_name = value;
    else if (flag == "--precision")
      precision = value;
    else if (flag == "--targets")
      targets = SplitComma(value);
    else if (flag == "--data")
      data = value;
    else if (flag == "--generations")
      generations = number();
    else if (flag == "--buddy")
      buddy = number() != 0;
    else if (flag == "--hf-config-out")
      hf_config_out = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (!hf_config_out.empty()) {
    // The preset as transformers builds it (bench/hf_reference_step.py --config): one source
    // of the shapes both sides time.
    auto model = PresetModelConfig(preset);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().message().c_str());
      return 2;
    }
    std::ofstream(hf_config_out) << model->ToHfJson().dump(2) << "\n";
    return 0;
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "--device: expected cpu or cuda, got %s\n", device_name.c_str());
    return 2;
  }
  if (device_name == "cuda" && !compat::CudaAvailable()) {
    std::fprintf(stderr, "--device cuda: no CUDA device (or this build has no CUDA)\n");
    return 1;
  }
  const torch::Device device =
      device_name == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (threads > 0) torch::set_num_threads(threads);
  tidal::testing::ScratchDir prepared;  // the bench data's token store
  TrainConfig config;
  config.model.preset = preset;
  config.dataset.uri = data;
  config.dataset.max_seq_len = seq;
  config.lora = {rank, 2.0 * rank, 0.0, targets};
  config.optimization.zero_stage = stage;
  config.optimization.precision = precision;
  config.optimization.global_batch_size = batch;
  config.optimization.micro_batch_size = batch;
  config.optimization.learning_rate = 1e-4;
  config.optimization.max_steps = warmup + steps;
  config.dataset.prepared_uri = prepared.path();
  TrainerOptions options;
  options.device = device;
  {
    data::StoreDataProvider provider({});
    Status ready = provider.Prepare(config);
    auto rows = ready.ok() ? provider.Open(config, 0) : StatusOr<std::unique_ptr<RowSource>>(ready);
    if (!rows.ok()) {
      std::fprintf(stderr, "%s\n", rows.status().message().c_str());
      return 1;
    }
    options.data = std::move(*rows);
  }
  auto sync = [&] {
#ifdef TIDAL_WITH_CUDA
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
  };
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto median_of = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "%s\n", status.message().c_str());
    return 1;
  };
  const auto create_start = Clock::now();
  auto trainer = Trainer::Create(config, MakeSingleRankComm(device), std::move(options));
  if (!trainer.ok()) return fail(trainer.status());
  sync();
  const double create_seconds = seconds_since(create_start);
  std::vector<double> regroup_times;
  for (int64_t g = 0; g < generations; ++g) {
    const auto start = Clock::now();
    (*trainer)->LeaveGroup();
    if (Status joined = (*trainer)->JoinGroup(MakeSingleRankComm(device)); !joined.ok())
      return fail(joined);
    sync();
    regroup_times.push_back(seconds_since(start));
  }
  tidal::objstore::MemoryStore memory("bench");
  std::vector<double> times, capture_times, write_times;
  uint64_t buddy_bytes = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    auto r = (*trainer)->Step();  // ends with the loss on the host: the step has finished
    if (!r.ok()) return fail(r.status());
    if (s < warmup) continue;
    times.push_back(r->seconds);
    if (!buddy) continue;
    const auto capture_start = Clock::now();
    auto write = tidal::checkpoint::CaptureBuddyCopy(**trainer, memory);
    if (!write.ok()) return fail(write.status());
    capture_times.push_back(seconds_since(capture_start));
    const auto write_start = Clock::now();
    auto bytes = (*write)();
    if (!bytes.ok()) return fail(bytes.status());
    write_times.push_back(seconds_since(write_start));
    buddy_bytes = *bytes;
    auto listed = memory.List("");
    if (!listed.ok()) return fail(listed.status());
    std::vector<std::string> keys;
    for (const auto& object : *listed) keys.push_back(object.key);
    if (Status gone = memory.Delete(keys); !gone.ok()) return fail(gone);
  }
  const double median = median_of(times);
  const auto model = *PresetModelConfig(preset);
  nlohmann::json line = {{"impl", "tidal"},
                         {"preset", preset},
                         {"device", device_name},
                         {"precision", precision},
                         {"batch", batch},
                         {"seq", seq},
                         {"lora_rank", rank},
                         {"targets", targets},
                         {"seconds_per_step", median},
                         {"tokens_per_s", static_cast<double>(batch * seq) / median},
                         {"base_params", model.BaseParameterCount()},
                         {"active_params", model.ActiveParameterCount()},
                         {"layers", model.num_hidden_layers},
                         {"hidden", model.hidden_size},
                         {"trainable_params", (*trainer)->parameters().TrainableParameterCount()},
                         {"peak_bytes", PeakBytes(device)},
                         {"threads", torch::get_num_threads()},
                         {"zero_stage", stage}};
  line["create_seconds"] = create_seconds;
  if (generations > 0) {
    line["regroup_seconds"] = median_of(regroup_times);
    line["regroup_over_create"] = median_of(regroup_times) / create_seconds;
  }
  if (buddy) {
    line["buddy_bytes"] = buddy_bytes;
    line["buddy_capture_seconds"] = median_of(capture_times);
    line["buddy_write_seconds"] = median_of(write_times);
    line["buddy_capture_over_step"] = median_of(capture_times) / median;
  }
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
