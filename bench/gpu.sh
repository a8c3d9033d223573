#!/usr/bin/env bash
# The engine against transformers + PEFT on one GPU, same torch, same config, same run:
# tokens/s, MFU and peak memory for each, and the ratio of their step times.
#
#   bench/gpu.sh pack [BUILD_DIR]   here: builds bench/engine_step_bench and bundles it, with the
#                                   shared libraries a GPU host's torch image lacks, into
#                                   out/gpu-bench (git-ignored)
#   bench/gpu.sh run                on the GPU host, from the repository root, with out/gpu-bench
#                                   carried there: runs both for each config and prints a table
#
# With the device tool: run `bench/gpu.sh pack` here, then run `bench/gpu.sh run` there with
# carry ["out/gpu-bench"]. The host's own torch (2.11, CUDA 13), transformers and peft are used:
# the engine binary loads the host's libtorch, so both sides run the same LibTorch.
#
# The engine's rows also carry issue 25's costs at the config's size: the engine kept into the
# next generation against built anew (GENERATIONS, default 3: the median of that many), and a
# buddy copy's cost to the training thread against the step (BUDDY=1, the default).
# ENGINE_ONLY=1 runs the engine alone (no transformers side: a short device lease).
#
# Configs (CONFIGS="1b 7b r1q7b v2lite" by default), each bf16, sequence 2048, LoRA r=64 on the
# attention projections, ZeRO-0; transformers builds each from the preset's config.json as the
# engine writes it (engine_step_bench --hf-config-out), so both time the same shape:
#   1b      the 1b preset (TinyLlama-1.1B shape), batch 4
#   7b      the 7b preset (deepseek-llm-7b shape), batch 2
#   r1q7b   r1-distill-qwen-7b (Qwen2: q/k/v bias), batch 2
#   v2lite  deepseek-v2-lite (latent attention, 64 experts), batch 2, LoRA on q/kv_a/kv_b/o
#   tiny    fp32, sequence 128, batch 4 (the CPU check: DEVICE=cpu CONFIGS=tiny bench/gpu.sh run)
# MFU counts model FLOPs per token as 4·N (forward, and backward to the activations: the base
# weights are frozen, so no weight gradients) + 12·L·seq·d (attention scores and values, forward
# and backward), N the parameters a token's compute uses (a MoE's active ones), against
# PEAK_TFLOPS (989: H100/H200 SXM, dense bf16).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bundle="$root/out/gpu-bench"

pack() {
  local build=${1:-$root/build}
  cmake --build "$build" --target engine_step_bench
  rm -rf "$bundle" && mkdir -p "$bundle/lib"
  cp "$build/bench/engine_step_bench" "$bundle/"
  # Every library the binary needs except torch's own (the host's torch provides those, and
  # its CUDA libraries) and the C runtime: those a torch image does not have (yaml-cpp, ...).
  ldd "$bundle/engine_step_bench" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$lib" in
      */torch/lib/*|*/nvidia/*|*/cuda/*) continue ;;
      */libc.so*|*/libm.so*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/ld-linux*) continue ;;
      */libgcc_s.so*|*/libstdc++.so*) continue ;;
    esac
    cp -L "$lib" "$bundle/lib/"
  done
  echo "gpu.sh: $(du -sh "$bundle" | cut -f1) in out/gpu-bench:" \
       "$(ls "$bundle/lib" | tr '\n' ' ')"
}

run() {
  local device=${DEVICE:-cuda} python=${PYTHON:-}
  if [[ -z "$python" ]]; then
    python=python3
    [[ -x "$root/tools/venv/bin/python3" ]] && python="$root/tools/venv/bin/python3"
  fi
  [[ -x "$bundle/engine_step_bench" ]] || { echo "gpu.sh: run \`bench/gpu.sh pack\` first" >&2; exit 1; }
  # The host's libtorch and the CUDA libraries of its wheels, then what the bundle brought.
  local libs
  libs=$("$python" - <<'PY'
import glob, os, site, torch
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
  export LD_LIBRARY_PATH="$libs:$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local steps=${STEPS:-5} warmup=${WARMUP:-2} results=()
  local configs
  configs=$(mktemp -d)
  for config in ${CONFIGS:-1b 7b r1q7b v2lite}; do
    local args=() targets=q_proj,k_proj,v_proj,o_proj preset
    case $config in
      1b) args=(--preset 1b --precision bf16 --seq 2048 --batch 4 --rank 64) ;;
      7b) args=(--preset 7b --precision bf16 --seq 2048 --batch 2 --rank 64) ;;
      r1q7b) args=(--preset r1-distill-qwen-7b --precision bf16 --seq 2048 --batch 2 --rank 64) ;;
      v2lite)
        args=(--preset deepseek-v2-lite --precision bf16 --seq 2048 --batch 2 --rank 64)
        targets=q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj ;;
      tiny) args=(--preset tiny --precision fp32 --seq 128 --batch 4 --rank 64) ;;
      *) echo "gpu.sh: unknown config $config (1b, 7b, r1q7b, v2lite, tiny)" >&2; exit 2 ;;
    esac
    preset=${args[1]}
    "$bundle/engine_step_bench" --preset "$preset" --hf-config-out "$configs/$preset.json"
    args+=(--device "$device" --targets "$targets" --steps "$steps" --warmup "$warmup")
    [[ -n "${THREADS:-}" ]] && args+=(--threads "$THREADS")
    echo "gpu.sh: $config: engine" >&2
    local line
    line=$("$bundle/engine_step_bench" "${args[@]}" --generations "${GENERATIONS:-3}" \
             --buddy "${BUDDY:-1}" --data "$root/examples/data/sample.jsonl")
    echo "$line" >&2  # as it comes: a run cut short keeps what it measured
    results+=("$line")
    [[ -n "${ENGINE_ONLY:-}" ]] && continue
    echo "gpu.sh: $config: transformers + peft" >&2
    line=$("$python" "$here/hf_reference_step.py" --config "$configs/$preset.json" "${args[@]}")
    echo "$line" >&2
    results+=("$line")
  done
  rm -rf "$configs"
  "$python" - "${PEAK_TFLOPS:-989}" "${results[@]}" <<'PY'
import json, os, sys
peak = float(sys.argv[1]) * 1e12
rows = [json.loads(l) for l in sys.argv[2:]]
# The engine's row of each config says how many parameters a token uses (a MoE's active ones).
active = {r["preset"]: r["active_params"] for r in rows if "active_params" in r}
def mfu(r):
    n = active.get(r["preset"], r["base_params"])
    flops_per_token = 4 * n + 12 * r["layers"] * r["seq"] * r["hidden"]
    return r["tokens_per_s"] * flops_per_token / peak
print(f"{'config':<20} {'impl':<18} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'step s':>8}")
for r in rows:
    print(f"{r['preset']:<20} {r['impl']:<18} {r['tokens_per_s']:>10.0f} {mfu(r):>7.1%} "
          f"{r['peak_bytes'] / 2**30:>9.2f} {r['seconds_per_step']:>8.3f}")
# Issue 25 on the engine's rows: a generation's engine kept against built anew, and a buddy
# copy against the step.
for r in rows:
    if "regroup_seconds" in r:
        print(json.dumps({"config": r["preset"], "device": r["device"],
                          "engine_built_s": r["create_seconds"],
                          "engine_kept_s": r["regroup_seconds"],
                          "kept_over_built": r["regroup_over_create"]}))
    if "buddy_capture_seconds" in r:
        print(json.dumps({"config": r["preset"], "device": r["device"],
                          "buddy_bytes": r["buddy_bytes"],
                          "buddy_capture_s": r["buddy_capture_seconds"],
                          "buddy_write_s": r["buddy_write_seconds"],
                          "step_s": r["seconds_per_step"],
                          "buddy_capture_over_step": r["buddy_capture_over_step"]}))
if os.environ.get("ENGINE_ONLY"):
    sys.exit(0)
for e, p in zip(rows[0::2], rows[1::2]):
    print(json.dumps({"config": e["preset"], "device": e["device"],
                      "step_time_ratio_engine_over_hf": e["seconds_per_step"] / p["seconds_per_step"],
                      "peak_memory_ratio_engine_over_hf": e["peak_bytes"] / p["peak_bytes"],
                      "engine_tokens_per_s": e["tokens_per_s"], "hf_tokens_per_s": p["tokens_per_s"],
                      "engine_mfu": mfu(e), "hf_mfu": mfu(p)}))
PY
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
