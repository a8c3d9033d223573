// The engine's half of bench/moe_layer.sh: one DeepSeek mixture-of-experts layer (routing,
// routed experts run grouped, shared experts) forward + backward to the tokens, the experts
// frozen as under LoRA, CPU fp32 — on the weights and tokens bench/moe_layer.py wrote, checked
// against transformers' output and gradient before it is timed.
//   moe_layer_bench DIR [--iters N] [--threads T]   → one JSON line
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "worker/engine/model_config.h"
#include "worker/engine/moe.h"
#include "worker/engine/safetensors.h"

using namespace tidal::engine;
namespace F = torch::nn::functional;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: moe_layer_bench DIR [--iters N] [--threads T]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int iters = 5, threads = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (flag == "--threads")
      threads = std::atoi(argv[i + 1]);
  }
  if (threads > 0) torch::set_num_threads(threads);
  auto config = ModelConfigFromHfJson(nlohmann::json::parse(std::ifstream(dir + "/config.json")));
  if (!config.ok()) {
    std::fprintf(stderr, "config.json: %s\n", config.status().ToString().c_str());
    return 1;
  }
  const MoeConfig& moe = config->moe;
  auto file = SafetensorsFile::Open(dir + "/weights.safetensors");
  auto reference = SafetensorsFile::Open(dir + "/reference.safetensors");
  if (!file.ok() || !reference.ok()) {
    std::fprintf(stderr, "weights or reference missing in %s\n", dir.c_str());
    return 1;
  }
  auto read = [&](const std::string& name) { return *(*file)->Read(name, torch::kFloat32); };
  const torch::Tensor router = read("gate.weight");
  const torch::Tensor bias =
      moe.sigmoid_scores() ? read("gate.e_score_correction_bias") : torch::Tensor();
  // Each expert's gate, up and down back to back in one buffer, as the engine's ZeRO blocks
  // hold them.
  std::vector<std::array<torch::Tensor, 3>> experts;
  for (int64_t e = 0; e < moe.n_routed_experts; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    std::array<torch::Tensor, 3> w = {read(p + "gate_proj.weight"), read(p + "up_proj.weight"),
                                      read(p + "down_proj.weight")};
    auto flat = torch::cat({w[0].flatten(), w[1].flatten(), w[2].flatten()});
    int64_t offset = 0;
    for (auto& t : w) {
      auto view = flat.narrow(0, offset, t.numel()).view(t.sizes());
      offset += t.numel();
      t = view;
    }
    experts.push_back(w);
  }
  const torch::Tensor shared_gate = read("shared_experts.gate_proj.weight"),
                      shared_up = read("shared_experts.up_proj.weight"),
                      shared_down = read("shared_experts.down_proj.weight");
  const torch::Tensor tokens = read("tokens");

  // The layer as worker/engine/model.cc runs it.
  auto once = [&] {
    auto x = tokens.clone().requires_grad_(true);
    const MoeRouting routing = RouteTokens(moe, x, router, bias);
    auto out =
        RunExperts(x, routing, moe.n_routed_experts, [&](int64_t e, const torch::Tensor& in) {
          const auto& w = experts[static_cast<size_t>(e)];
          return ExpertMlp(in, w[0], w[1], w[2]);
        });
    out =
        out + F::linear(F::silu(F::linear(x, shared_gate)) * F::linear(x, shared_up), shared_down);
    out.sum().backward();
    return std::pair{out.detach(), x.grad()};
  };
  auto [out, grad] = once();
  auto expected_out = *(*reference)->Read("output", torch::kFloat32);
  auto expected_grad = *(*reference)->Read("grad", torch::kFloat32);
  const double out_err =
      (out - expected_out).abs().max().item<double>() / expected_out.abs().max().item<double>();
  const double grad_err =
      (grad - expected_grad).abs().max().item<double>() / expected_grad.abs().max().item<double>();
  if (out_err > 1e-4 || grad_err > 1e-4) {
    std::fprintf(stderr, "differs from transformers: output %.3g, gradient %.3g (relative)\n",
                 out_err, grad_err);
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  std::printf("%s\n", nlohmann::json({{"seconds_per_iter", seconds},
                                      {"threads", torch::get_num_threads()},
                                      {"max_relative_error", std::max(out_err, grad_err)}})
                          .dump()
                          .c_str());
  return 0;
}
