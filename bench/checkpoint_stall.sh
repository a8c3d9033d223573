#!/usr/bin/env bash
# bench/checkpoint_stall.sh BUILD_DIR [PRESET] [STEPS] [NPROC] — training stall from
# asynchronous checkpointing: median tokens/s of a run that writes a full checkpoint (LoRA
# weights + AdamW moments) to file:// after every step, against the same run without
# checkpoints, alternating ROUNDS times; and the training thread's own time per checkpoint
# over a step's time. Prints one JSON line with the ratios (1.0 = no stall).
set -euo pipefail
build=${1:?usage: bench/checkpoint_stall.sh BUILD_DIR [PRESET] [STEPS] [NPROC]}
preset=${2:-tiny}
steps=${3:-20}
nproc=${4:-2}
rounds=${ROUNDS:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e "s/preset: tiny/preset: $preset/" -e "s|uri: data/sample.jsonl|uri: $here/examples/data/sample.jsonl|" \
  "$here/examples/tiny-lora.yaml" > "$work/job.yaml"
median_tps() {  # stdout JSON lines → median tokens/s, skipping the first two (warm-up) steps
  python3 -c 'import json,sys,statistics
v=[json.loads(l)["tokens_per_s"] for l in sys.stdin if l.startswith("{")][2:]
print(statistics.median(v))'
}
base=() ckpt=()
for r in $(seq "$rounds"); do
  base+=("$("$build/worker/tidal-train" --config "$work/job.yaml" --nproc "$nproc" \
    --max-steps "$steps" 2>/dev/null | median_tps)")
  rm -rf "$work/ck"
  ckpt+=("$("$build/worker/tidal-train" --config "$work/job.yaml" --nproc "$nproc" \
    --max-steps "$steps" --checkpoint-uri "file://$work/ck" --full-every 1 --keep 2 \
    2>>"$work/ckpt.log" | median_tps)")
done
# Besides the tokens/s of the two runs (noisy when steps are long and few), the hooks log the
# time each checkpoint kept the training thread ("checkpoint stall"): that over the step time
# of the run without checkpoints (tokens per step = global batch × sequence length).
python3 - "$preset" "$nproc" "${base[*]}" "${ckpt[*]}" "$work/ckpt.log" "$work/job.yaml" <<'PY'
import json, re, statistics, sys
preset, nproc, base, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
b = statistics.median(map(float, base)); c = statistics.median(map(float, ckpt))
blocked = []
for line in open(sys.argv[5]):
    if line.startswith("{") and '"checkpoint stall"' in line:
        blocked.append(json.loads(line)["training_thread_seconds"])
job = open(sys.argv[6]).read()
tokens_per_step = int(re.search(r"globalBatchSize: (\d+)", job).group(1)) * \
    int(re.search(r"maxSeqLen: (\d+)", job).group(1))
step_s = tokens_per_step / b
out = {"bench": "checkpoint_stall", "preset": preset, "nproc": nproc,
       "tokens_per_s_without": b, "tokens_per_s_checkpoint_every_step": c,
       "ratio_with_vs_without": c / b, "added_time_per_step": b / c - 1,
       "step_seconds_without": step_s}
if blocked:
    out["training_thread_seconds_per_checkpoint"] = statistics.median(blocked)
    out["training_thread_stall_fraction_of_step"] = statistics.median(blocked) / step_s
print(json.dumps(out))
PY
