#!/usr/bin/env bash
# bench/auto_micro_batch.sh BUILD_DIR [PRESET] [STEPS] [NPROC] — spec.optimization.microBatchSize
# auto against the fixed default (microBatchSize 1) on the same job: median tokens/s of each
# (the auto run's steps after its size stopped changing), alternating ROUNDS times, and the
# size auto settled at. Prints one JSON line; ratio > 1: auto is faster.
set -euo pipefail
build=${1:?usage: bench/auto_micro_batch.sh BUILD_DIR [PRESET] [STEPS] [NPROC]}
preset=${2:-small}
steps=${3:-10}
nproc=${4:-2}
rounds=${ROUNDS:-1}
global=${GLOBAL_BATCH:-8}
seq=${SEQ_LEN:-64}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job() {  # $1: microBatchSize
  sed -e "s/preset: tiny/preset: $preset/" \
      -e "s|uri: data/sample.jsonl|uri: $here/examples/data/sample.jsonl|" \
      -e "s/maxSeqLen: 32/maxSeqLen: $seq/" \
      -e "s/globalBatchSize: 8/globalBatchSize: $global/" \
      -e "s/microBatchSize: 2/microBatchSize: $1/" \
      -e "s/maxSteps: 200/maxSteps: $steps/" \
      "$here/examples/tiny-lora.yaml"
}
job 1 > "$work/fixed.yaml"
job auto > "$work/auto.yaml"
for r in $(seq "$rounds"); do
  "$build/worker/tidal-train" --config "$work/fixed.yaml" --nproc "$nproc" 2>/dev/null \
    > "$work/fixed-$r.jsonl"
  "$build/worker/tidal-train" --config "$work/auto.yaml" --nproc "$nproc" 2>/dev/null \
    > "$work/auto-$r.jsonl"
done
python3 - "$work" "$rounds" "$preset" "$nproc" "$global" "$seq" <<'PY'
import json, statistics, sys
work, rounds, preset, nproc, global_batch, seq = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def steps(path):
    return [json.loads(l) for l in open(path) if l.startswith("{") and '"step"' in l]
fixed, auto, settled = [], [], []
for r in range(1, rounds + 1):
    f = steps(f"{work}/fixed-{r}.jsonl")
    fixed.append(statistics.median(s["tokens_per_s"] for s in f[2:]))
    a = steps(f"{work}/auto-{r}.jsonl")
    final = a[-1]["micro_batch"]
    held = [s for s in a if s["micro_batch"] == final]
    settled.append(final)
    auto.append(statistics.median(s["tokens_per_s"] for s in held))
    losses = [abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, f)]
print(json.dumps({
    "bench": "auto_micro_batch", "preset": preset, "nproc": int(nproc),
    "global_batch": int(global_batch), "seq_len": int(seq),
    "tokens_per_s_fixed_micro_1": statistics.median(fixed),
    "tokens_per_s_auto": statistics.median(auto),
    "ratio_auto_vs_fixed": statistics.median(auto) / statistics.median(fixed),
    "auto_settled_at": settled, "steps_at_settled_size": len(held),
    "max_relative_loss_difference": max(losses)}))
PY
