// api/spec_limits.h — the largest values a TrainingJob spec may hold. Each bound is far
// above what a real job uses and low enough that every product the planner and the engine
// form from spec values (microBatchSize × GPUs, a backoff doubled 20 times, steps × global
// batch) stays inside int64. crds/tidal.dev_trainingjobs.yaml carries the same numbers as
// `maximum` (tests/unit/api/crd_test.cc holds them equal), so the API server refuses a value
// above them at admission; the operator and the worker refuse it again with the field's name,
// for a CRD installed before a bound existed.
#pragma once

#include <cstdint>

namespace tidal::spec {

// GPUs of one job (minGPUs, maxGPUs, a schedule window's gpus, spec.replicas): 2^16, more than
// the largest training clusters built so far.
inline constexpr int64_t kMaxGpus = 65536;
// GPUs of one pod: a node has 8 or 16; 64 leaves room.
inline constexpr int64_t kMaxGpusPerPod = 64;
// Sequences per optimizer step: 2^24. The planner enumerates the divisors of
// globalBatchSize / microBatchSize by trial division up to its square root (≤ 4,096 tries).
inline constexpr int64_t kMaxGlobalBatchSize = int64_t{1} << 24;
// Sequences per rank per forward pass.
inline constexpr int64_t kMaxMicroBatchSize = 65536;
// Most micro-batches one rank runs per optimizer step (at minGPUs, the longest case). Every
// barrier (rescale, checkpoint, suspend, deletion) waits for a step boundary, so a step of
// millions of micro-batches (globalBatchSize 2^24 at microBatchSize 1, accepted once) held every
// one of them for hours. 4096 is 8x a 512-sequence batch at microBatchSize 1 on one GPU.
inline constexpr int64_t kMaxMicroBatchesPerStep = 4096;
// Tokens per packed sequence: 2^20 (1M-token contexts).
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
// LoRA rank: the widest hidden size of the supported families is 8,192; PEFT users stay in
// the tens to hundreds.
inline constexpr int64_t kMaxLoraRank = 8192;
// Optimizer steps, and every step count of a spec (warmup, checkpoint intervals,
// acknowledgedStep).
inline constexpr int64_t kMaxSteps = 1'000'000'000;
// spec.elastic.priority: the range of a user's PriorityClass value (larger ones are the system's).
inline constexpr int64_t kMaxPriority = 1'000'000'000;
// spec.elastic.weight: a share of the headroom among jobs of one priority.
inline constexpr int64_t kMaxWeight = 1000;
// Every duration in seconds (cooldown, scale-up timeout, restart backoff): one week.
inline constexpr int64_t kMaxSeconds = 7 * 24 * 3600;
// The adaptive warmup's window of steps.
inline constexpr int64_t kMaxWarmupWindow = 100000;
// spec.anomaly.consecutiveSteps: a rise of k steps needs k + 1 of them, and each worker reports
// its newest 64.
inline constexpr int64_t kMaxAnomalySteps = 63;
// Restarts of one job; checkpoints kept.
inline constexpr int64_t kMaxRestarts = 100000;
inline constexpr int64_t kMaxKeep = 10000;

}  // namespace tidal::spec
