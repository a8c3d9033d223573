#!/usr/bin/env bash
# The data loader on the demo's chat data, its token store on S3 (moto on loopback, SigV4):
# time to the first step with a cold node-local cache against a warm one (same job, same run),
# and the share of step time spent waiting for rows.
#   bench/data_loader.sh [STEPS]        (default 30; run `make build` first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
py=$root/tools/venv/bin/python3
steps=${1:-30}
work=$(mktemp -d)
s3_pid=""
cleanup() { [[ -n "$s3_pid" ]] && kill "$s3_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

"$py" "$root/tools/s3_server.py" --bucket data >"$work/s3.json" 2>"$work/s3.log" &
s3_pid=$!
for _ in $(seq 1 100); do [[ -s "$work/s3.json" ]] && break; sleep 0.2; done
field() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/s3.json" "$1"; }
export AWS_ACCESS_KEY_ID=$(field access_key) AWS_SECRET_ACCESS_KEY=$(field secret_key)
export AWS_ENDPOINT_URL_S3=$(field endpoint) AWS_REGION=us-east-1

store=$("$build/worker/tidal-prep" --input "$root/examples/data/chat.jsonl" --format messages \
        --output s3://data/tokens --model "$root/examples/chat-tokenizer" 2>/dev/null |
        "$py" -c 'import json,sys; print(json.load(sys.stdin)["store"])')
cat >"$work/job.yaml" <<YAML
model: {preset: tiny, seed: 0}
dataset:
  uri: $store
  format: messages
  maxSeqLen: 128
  tokenizer: $root/examples/chat-tokenizer
  loader: {cacheDir: $work/cache, warmupPercent: 100, lookahead: 32}
lora: {rank: 8, alpha: 16, targetModules: [q_proj, k_proj, v_proj, o_proj]}
optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 8, microBatchSize: 2,
  learningRate: 3.0e-3, maxSteps: $steps, seed: 0}
YAML

run() {  # prints: seconds to the first step line, wait share of step time
  local start first
  start=$(date +%s.%N)
  "$build/worker/tidal-train" --config "$work/job.yaml" --nproc 2 >"$work/out.jsonl" 2>"$work/err.log" &
  local pid=$!
  while ! grep -q '"step"' "$work/out.jsonl" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/err.log" >&2; exit 1; }
    sleep 0.05
  done
  first=$(date +%s.%N)
  wait "$pid"
  "$py" - "$work/out.jsonl" "$start" "$first" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
wait = sum(l["data_wait_s"] for l in lines)
busy = sum(l["seconds"] for l in lines)
print(f"{float(sys.argv[3]) - float(sys.argv[2]):.2f} {100 * wait / busy:.2f}")
PY
}
read -r cold cold_wait < <(run)
read -r warm warm_wait < <(run)
echo "time to first step, cold cache: ${cold} s (data wait ${cold_wait}% of step time)"
echo "time to first step, warm cache: ${warm} s (data wait ${warm_wait}% of step time)"
"$py" -c "print(f'cold / warm: {$cold / $warm:.2f}x')"
