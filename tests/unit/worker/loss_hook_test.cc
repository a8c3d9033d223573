// The worker's reported-loss test hook (worker/control/loss_hook.h) and its GPU monitor
// (gpu_monitor.h) where there is no NVML: what each yields, and each bad hook refused by name.
#include "worker/control/loss_hook.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include "worker/control/gpu_monitor.h"

namespace tidal::worker {
namespace {

TEST(LossHook, RiseMultipliesTheLossFromItsStepOnAndNoiseAlternatesAroundTheRunningMean) {
  auto rise = ParseLossHook("rise:8:1.2");
  ASSERT_TRUE(rise.ok()) << rise.status().ToString();
  EXPECT_DOUBLE_EQ(rise->Apply(7, 2.0), 2.0);
  EXPECT_DOUBLE_EQ(rise->Apply(8, 2.0), 2.4);
  EXPECT_DOUBLE_EQ(rise->Apply(10, 2.0), 2.0 * 1.2 * 1.2 * 1.2);
  auto noise = ParseLossHook("noise:0.3");
  ASSERT_TRUE(noise.ok());
  EXPECT_DOUBLE_EQ(noise->Apply(1, 2.0), 2.6);
  EXPECT_DOUBLE_EQ(noise->Apply(2, 2.0), 1.4);
  // A real loss that jumps 3x on the even step: the swing around the mean still falls.
  EXPECT_DOUBLE_EQ(noise->Apply(3, 2.0), 2.6);
  EXPECT_DOUBLE_EQ(noise->Apply(4, 6.0), (0.9 * 2.0 + 0.1 * 6.0) * 0.7);
  // However the real loss spreads (here up to 4x from one step to the next), an even step
  // never reports more than the odd step before it: no three rising steps in a row.
  double odd = 0;
  for (int64_t step = 5; step <= 60; ++step) {
    const double real = step % 3 == 0 ? 8.0 : 2.0;
    const double reported = noise->Apply(step, real);
    if (step % 2 != 0)
      odd = reported;
    else
      EXPECT_LT(reported, odd) << "step " << step;
  }
  auto none = ParseLossHook("");
  ASSERT_TRUE(none.ok());
  EXPECT_DOUBLE_EQ(none->Apply(5, 2.0), 2.0);
}

TEST(LossHook, BadHooksAreRefusedNamingTheVariableAndTheForms) {
  for (const char* bad : {"rise", "rise:0:1.2", "rise:8", "rise:8:0", "rise:8:x", "rise:1.5:2",
                          "noise:1", "noise:0", "noise:-0.1", "noise", "jump:3", "rise:8:1.2:9"}) {
    auto hook = ParseLossHook(bad);
    ASSERT_FALSE(hook.ok()) << bad;
    EXPECT_EQ(hook.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(hook.status().message().find("TIDAL_TEST_LOSS_HOOK"), std::string::npos);
    EXPECT_NE(hook.status().message().find(bad), std::string::npos) << hook.status().message();
  }
}

TEST(GpuMonitor, WithoutNvmlThereIsNoMonitorAndItSaysWhy) {
  std::string why;
  auto monitor = GpuMonitor::Open(&why, "libnvidia-ml-absent-for-this-test.so.1");
  EXPECT_EQ(monitor, nullptr);
  EXPECT_NE(why.find("NVML not available"), std::string::npos) << why;
}

// Against an NVML stand-in with NVML's C signatures (tests/unit/worker/fake_nvml.c): the
// figures summed and averaged over the pod's GPUs, and the CPUs NVML calls ideal for a GPU read
// from its bitmask of unsigned longs (the worker's NUMA binding starts from them).
TEST(GpuMonitor, ReadsTheFiguresAndEachGpusIdealCpusFromNvml) {
  std::string why;
  auto monitor = GpuMonitor::Open(&why, FAKE_NVML);
  ASSERT_NE(monitor, nullptr) << why;
  EXPECT_EQ(monitor->devices(), 2);
  const auto sample = monitor->Sample();
  ASSERT_TRUE(sample);
  EXPECT_DOUBLE_EQ(sample->utilization_percent, 50);
  EXPECT_EQ(sample->memory_used_bytes, int64_t{40} << 30);
  EXPECT_EQ(sample->memory_total_bytes, int64_t{160} << 30);
  EXPECT_EQ(monitor->IdealCpus(0), (std::vector<int>{2, 3, 66}));
  EXPECT_EQ(monitor->IdealCpus(1), std::nullopt);  // NVML names none
  EXPECT_EQ(monitor->IdealCpus(2), std::nullopt);
  EXPECT_EQ(monitor->IdealCpus(-1), std::nullopt);
  // Which GPU is this worker's: CUDA_VISIBLE_DEVICES' (or the device plugin's) first.
  EXPECT_EQ(monitor->IndexOf(""), 0);
  EXPECT_EQ(monitor->IndexOf("all"), 0);
  EXPECT_EQ(monitor->IndexOf("1,0"), 1);
  EXPECT_EQ(monitor->IndexOf("GPU-1111-bbbb"), 1);
  EXPECT_EQ(monitor->IndexOf("GPU-0000-aaaa,GPU-1111-bbbb"), 0);
  EXPECT_EQ(monitor->IndexOf("2"), std::nullopt);
  EXPECT_EQ(monitor->IndexOf("GPU-ffff"), std::nullopt);
  EXPECT_EQ(monitor->IndexOf("99999999999"), std::nullopt);
}

TEST(GpuMonitor, ALibraryWithoutTheNvmlFunctionsIsRefused) {
  std::string why;
  auto monitor = GpuMonitor::Open(&why, "libm.so.6");  // loads, but is not NVML
  EXPECT_EQ(monitor, nullptr);
  EXPECT_NE(why.find("lacks the NVML functions"), std::string::npos) << why;
}

}  // namespace
}  // namespace tidal::worker
