#!/usr/bin/env bash
# Step time of the engine against the same model + LoRA in Python as users run it:
# transformers' model of the preset's shape (from the config.json the engine writes for it) with a
# PEFT adapter and torch.optim.AdamW (bench/hf_reference_step.py), on tools/venv's torch, whose LibTorch the engine links. CPU,
# one rank, fp32, same batch, LoRA r=16 on all seven projections, same thread count. The two run
# alternately, ROUNDS times, and the ratio of the medians is printed: engine / python (< 1:
# engine faster).
#   bench/step_time_vs_python.sh [BUILD_DIR]     (ROUNDS=3 PRESETS="tiny small" to change)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
rounds=${ROUNDS:-3}
threads=${THREADS:-$(nproc)}
python=$here/../tools/venv/bin/python3
configs=$(mktemp -d)
trap 'rm -rf "$configs"' EXIT
for preset in ${PRESETS:-tiny small}; do
  case $preset in
    tiny) args=(--batch 4 --seq 128 --steps 8) ;;
    small) args=(--batch 2 --seq 128 --steps 3 --warmup 1) ;;
  esac
  engine=() reference=()
  "$build/bench/engine_step_bench" --preset "$preset" --hf-config-out "$configs/$preset.json"
  for ((i = 0; i < rounds; i++)); do
    engine+=("$("$build/bench/engine_step_bench" --preset "$preset" --threads "$threads" "${args[@]}" 2>/dev/null)")
    reference+=("$("$python" "$here/hf_reference_step.py" --config "$configs/$preset.json" --preset "$preset" --threads "$threads" "${args[@]}")")
  done
  "$python" - "$preset" "${engine[@]}" "${reference[@]}" <<'PY'
import json, statistics, sys
preset, lines = sys.argv[1], [json.loads(l) for l in sys.argv[2:]]
n = len(lines) // 2
e = statistics.median(l["seconds_per_step"] for l in lines[:n])
p = statistics.median(l["seconds_per_step"] for l in lines[n:])
print(f"{preset}: engine {e*1000:.1f} ms/step, transformers+peft {p*1000:.1f} ms/step, "
      f"ratio engine/python = {e/p:.3f} (median of {n} runs each, {lines[0]['threads']} threads)")
PY
done
