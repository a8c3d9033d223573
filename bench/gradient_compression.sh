#!/usr/bin/env bash
# bench/gradient_compression.sh BUILD_DIR [PRESET] [STEPS] [NPROC] [RATIO] — top-k gradient
# compression (spec.optimization.gradientCompression) against the uncompressed run of the same
# job at NPROC ranks (gloo on loopback, ZeRO stage 1), ROUNDS times alternating: the bytes each
# rank hands to its gradient collectives per step (the engine's count), the loopback interface's
# bytes per step (/proc/net/dev, the whole run's, start included), the median step time, the
# time spent selecting and the wait for exchanges backward did not hide, the loss after STEPS;
# and the model of where compression pays: per-rank ring wire bytes (reduce-scatter:
# (W-1)/W x payload; all-gather: (W-1) x payload) over a link of B bytes/s added to each step's
# measured time (loopback's own transfer time is left in both), and the bandwidth at which the
# two are equal. Prints one JSON line; ratio < 1: compressed is faster / smaller.
set -euo pipefail
build=${1:?usage: bench/gradient_compression.sh BUILD_DIR [PRESET] [STEPS] [NPROC] [RATIO]}
preset=${2:-tiny}
steps=${3:-12}
nproc=${4:-4}
ratio=${5:-0.05}
rounds=${ROUNDS:-1}
global=${GLOBAL_BATCH:-8}
seq=${SEQ_LEN:-64}
rank=${LORA_RANK:-64}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job() {  # $1: the gradientCompression mapping
  cat <<YAML
model: {preset: $preset, seed: 3}
dataset: {uri: $here/examples/data/sample.jsonl, format: text, maxSeqLen: $seq}
lora: {rank: $rank, alpha: $((rank * 2)), targetModules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
optimization: {zeroStage: 1, precision: fp32, globalBatchSize: $global, microBatchSize: 1,
  learningRate: 1.0e-3, maxSteps: $steps, seed: 1, gradientCompression: $1}
YAML
}
job "{method: none}" > "$work/dense.yaml"
job "{method: topk, ratio: $ratio, warmupSteps: 0}" > "$work/topk.yaml"
lo_bytes() { awk '/^ *lo:/ {print $10}' /proc/net/dev; }  # transmitted
for r in $(seq "$rounds"); do
  for kind in dense topk; do
    before=$(lo_bytes)
    "$build/worker/tidal-train" --config "$work/$kind.yaml" --nproc "$nproc" 2>/dev/null \
      > "$work/$kind-$r.jsonl"
    echo $(( $(lo_bytes) - before )) > "$work/$kind-$r.lo"
  done
done
python3 - "$work" "$rounds" "$preset" "$nproc" "$ratio" "$steps" <<'PY'
import json, statistics, sys
work, rounds, preset, nproc, ratio, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
def run(kind):
    secs, payload, lo, loss, select, wait = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        s = [json.loads(l) for l in open(f"{work}/{kind}-{r}.jsonl")
             if l.startswith("{") and '"step"' in l]
        assert len(s) == steps, f"{kind}: {len(s)} of {steps} steps"
        warm = s[2:]  # the first steps pay for warming caches and the allocator
        secs.append(statistics.median(x["seconds"] for x in warm))
        payload.append(statistics.median(x["gradient_bytes"] for x in warm))
        select.append(statistics.median(x.get("compress_s", 0) for x in warm))
        wait.append(statistics.median(x.get("exchange_wait_s", 0) for x in warm))
        lo.append(int(open(f"{work}/{kind}-{r}.lo").read()) / steps)
        loss.append(s[-1]["loss"])
    return {"step_s": statistics.median(secs), "payload": statistics.median(payload),
            "lo_per_step": statistics.median(lo), "loss": statistics.median(loss),
            "select_s": statistics.median(select), "wait_s": statistics.median(wait)}
d, t = run("dense"), run("topk")
w = nproc
wire_dense = (w - 1) / w * d["payload"]   # ring reduce-scatter of the fp64 gradient
wire_topk = (w - 1) * t["payload"]        # ring all-gather of every rank's message
extra = t["step_s"] - d["step_s"]         # what compressing costs on a link that is ~free
saved = wire_dense - wire_topk
if saved <= 0:
    breakeven = None                      # sends more: never pays
elif extra <= 0:
    breakeven = float("inf")              # faster even on loopback: pays at any bandwidth
else:
    breakeven = saved / extra             # bytes/s below which compression is faster
def at(gbit):
    b = gbit * 1e9 / 8
    return {"gbit_s": gbit, "dense_step_s": d["step_s"] + wire_dense / b,
            "topk_step_s": t["step_s"] + wire_topk / b}
print(json.dumps({
    "bench": "gradient_compression", "preset": preset, "nproc": nproc, "ratio": ratio,
    "steps": steps, "rounds": rounds,
    "gradient_payload_bytes_per_rank_step": {"dense": d["payload"], "topk": t["payload"]},
    "payload_ratio_topk_vs_dense": t["payload"] / d["payload"],
    "ring_wire_bytes_per_rank_step": {"dense": wire_dense, "topk": wire_topk},
    "wire_ratio_topk_vs_dense": wire_topk / wire_dense,
    "loopback_bytes_per_step_all_ranks": {"dense": d["lo_per_step"], "topk": t["lo_per_step"]},
    "loopback_ratio_topk_vs_dense": t["lo_per_step"] / d["lo_per_step"],
    "median_step_s": {"dense": d["step_s"], "topk": t["step_s"]},
    "step_time_ratio_topk_vs_dense": t["step_s"] / d["step_s"],
    "topk_select_s": t["select_s"], "topk_exchange_wait_s": t["wait_s"],
    "loss_at_end": {"dense": d["loss"], "topk": t["loss"]},
    # Below this link bandwidth (per rank) compression is faster; "any": faster on loopback
    # already; null: it sends more and never pays.
    "breakeven_gbit_s": None if breakeven is None else
        ("any" if breakeven == float("inf") else breakeven * 8 / 1e9),
    "modelled": [at(g) for g in (1, 10, 100)]}))
PY
