#!/usr/bin/env bash
# bench/checkpoint_compression.sh BUILD_DIR [PRESET] [STEPS] — zstd on real LoRA + optimizer
# state: tidal-train trains PRESET (LoRA rank 16 on every module, AdamW, top-k gradient
# compression so that residuals are saved too) for STEPS steps at 2 ranks and writes a full
# checkpoint, then checkpoint_compression_bench compresses its shards in the checkpoint's 64 KiB
# chunks and prints ratio and throughput against memcpy and a file write of the same bytes.
set -euo pipefail
build=${1:?usage: bench/checkpoint_compression.sh BUILD_DIR [PRESET] [STEPS]}
preset=${2:-small}
steps=${3:-20}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/job.yaml" <<YAML
model: {preset: $preset, seed: 3}
dataset: {uri: $here/examples/data/sample.jsonl, format: text, maxSeqLen: 64}
lora: {rank: 16, alpha: 32, targetModules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
optimization: {zeroStage: 1, precision: fp32, globalBatchSize: 4, microBatchSize: 1,
  learningRate: 2.0e-4, maxSteps: $steps, seed: 1,
  gradientCompression: {method: topk, ratio: 0.05, warmupSteps: 2}}
YAML
"$build/worker/tidal-train" --config "$work/job.yaml" --nproc 2 --checkpoint-uri "$work/ckpt" \
  --full-every "$steps" > /dev/null 2> "$work/train.err" || { tail -5 "$work/train.err"; exit 1; }
step=$(printf 'step-%08d' "$steps")
"$build/bench/checkpoint_compression_bench" "$work/ckpt/$step"/shard-*.safetensors
