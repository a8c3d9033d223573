#!/usr/bin/env bash
# One DeepSeek mixture-of-experts layer, forward + backward to the tokens (experts frozen, as
# under LoRA), CPU fp32: the engine (worker/engine/moe.cc via bench/moe_layer_bench) against
# transformers' DeepseekV2Moe / DeepseekV3MoE (bench/moe_layer.py, with the experts
# implementation transformers picks — grouped_mm — and with its eager loop), on the same weights
# and tokens; the engine's output and gradient are checked against transformers' first. Default
# shape: DeepSeek-V2-Lite's layer at half width (hidden 1024, 64 experts of 704, 6 per token,
# 2 shared), 512 tokens. The runs alternate ROUNDS times; the ratio of the medians is printed
# (engine / transformers; < 1: engine faster).
#   bench/moe_layer.sh [BUILD_DIR]      (ROUNDS=3 FAMILIES="deepseek_v2 deepseek_v3" ITERS=3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
rounds=${ROUNDS:-3}
iters=${ITERS:-3}
threads=${THREADS:-$(nproc)}
python=$here/../tools/venv/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for family in ${FAMILIES:-deepseek_v2 deepseek_v3}; do
  "$python" "$here/moe_layer.py" make "$work/$family" --family "$family"
  engine=() grouped=() eager=()
  for ((i = 0; i < rounds; i++)); do
    grouped+=("$("$python" "$here/moe_layer.py" time "$work/$family" --iters "$iters" --threads "$threads")")
    engine+=("$("$build/bench/moe_layer_bench" "$work/$family" --iters "$iters" --threads "$threads")")
    eager+=("$("$python" "$here/moe_layer.py" time "$work/$family" --iters "$iters" --threads "$threads" --implementation eager)")
  done
  "$python" - "$family" "$rounds" "${engine[@]}" "${grouped[@]}" "${eager[@]}" <<'PY'
import json, statistics, sys
family, n = sys.argv[1], int(sys.argv[2])
runs = [json.loads(l) for l in sys.argv[3:]]
median = lambda rs: statistics.median(r["seconds_per_iter"] for r in rs)
e, g, x = median(runs[:n]), median(runs[n:2 * n]), median(runs[2 * n:])
print(f"{family}: engine {e*1000:.0f} ms, transformers grouped_mm {g*1000:.0f} ms, eager "
      f"{x*1000:.0f} ms; engine/grouped_mm = {e/g:.2f}, engine/eager = {e/x:.2f} (median of {n}, "
      f"{runs[0]['threads']} threads, engine max relative error "
      f"{max(r['max_relative_error'] for r in runs[:n]):.1e})")
PY
done
