#!/usr/bin/env bash
# tools/demo.sh BUILD_DIR — what `make demo` runs: `tidal local` (1 node, 4 GPUs, the operator
# inside), a TrainingJob whose schedule window opens about a minute from now and closes two
# minutes later (in Asia/Shanghai time), `kubectl get tj -w` while it grows 2 → 4 and shrinks
# 4 → 2, then a summary. Cleans up on exit or Ctrl-C. Everything it wrote is under out/demo/.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in /*) ;; *) build="$root/$build" ;; esac
tidal="$build/operator/tidal"
kubectl_bin=$(command -v kubectl || echo "$root/tools/bin/kubectl")
out="$root/out/demo"
rm -rf "$out"
mkdir -p "$out"
data="$out/cluster"
tz=Asia/Shanghai
limit_s=540  # the whole demo stays under 10 minutes

say() { printf '\n== %s\n' "$*"; }
k() { "$kubectl_bin" --kubeconfig="$data/kubeconfig" "$@"; }

cluster_pid="" watch_pid=""
cleanup() {
  set +e
  [[ -n "$watch_pid" ]] && kill "$watch_pid" 2>/dev/null
  if [[ -n "$cluster_pid" ]]; then
    kill "$cluster_pid" 2>/dev/null
    wait "$cluster_pid" 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting tidal local (1 node, 4 GPUs, the operator and the TrainingJob CRD)"
"$tidal" local --data "$data" --gpus 4 --port 0 >"$out/cluster.out" 2>"$out/tidal-local.log" &
cluster_pid=$!
for _ in $(seq 1 100); do
  grep -q 'export KUBECONFIG' "$out/cluster.out" 2>/dev/null && break
  sleep 0.2
done
grep -q 'export KUBECONFIG' "$out/cluster.out" || { echo "tidal local did not start: see $out/tidal-local.log"; exit 1; }
for _ in $(seq 1 50); do k get crd trainingjobs.tidal.dev >/dev/null 2>&1 && break; sleep 0.2; done

# The window: from the minute that starts 30-90 s from now, for two minutes, on the job's clock.
start=$(TZ=$tz date -d '+90 seconds' '+%-M %-H')
end=$(TZ=$tz date -d '+210 seconds' '+%-M %-H')
opens=$(TZ=$tz date -d '+90 seconds' '+%H:%M')
closes=$(TZ=$tz date -d '+210 seconds' '+%H:%M')
sed -e "s|@DATASET@|$root/examples/data/chat.jsonl|" \
    -e "s|@TOKENIZER@|$root/examples/chat-tokenizer|" -e "s|@TZ@|$tz|" \
    -e "s|@START@|$start * * *|" -e "s|@END@|$end * * *|" \
    "$root/examples/demo-job.yaml" >"$out/demo-job.yaml"
say "kubectl apply -f examples/demo-job.yaml   (window $opens-$closes $tz: 4 GPUs; else 2)"
k apply -f "$out/demo-job.yaml"

say "kubectl get tj -w"
k get tj demo -w &
watch_pid=$!

# Every 2 s: the operator's /metrics (the job's step, GPUs desired and current, generation) and
# rank 0's (its loss), one line each into timeline.tsv, drawn at the end (tools/plot-demo.sh).
metrics_port=$(cat "$data/operator-metrics-port" 2>/dev/null || echo 0)
metric() {  # metric TEXT NAME → the value of NAME{...trainingjob="demo"...}, else "-"
  awk -v n="$2" '$1 ~ "^"n"[{]" && $1 ~ /trainingjob="demo"/ {v = $2} END {print (v == "" ? "-" : v)}' <<<"$1"
}
scrape() {
  local op rank0 ip
  op=$(curl -s --max-time 1 "http://127.0.0.1:$metrics_port/metrics" || true)
  ip=$(k get pod demo-worker-0 -o jsonpath='{.status.podIP}' 2>/dev/null || true)
  rank0=$([[ -n "$ip" ]] && curl -s --max-time 1 "http://$ip:9090/metrics" || true)
  printf '%s %s %s %s %s %s\n' "$(( $(date +%s) - t0 ))" "$(metric "$op" tidal_trainingjob_step)" \
    "$(awk '$1 ~ /^tidal_worker_loss[{ ]/ {v = $2} END {print (v == "" ? "-" : v)}' <<<"$rank0")" \
    "$(metric "$op" tidal_trainingjob_gpus_desired)" "$(metric "$op" tidal_trainingjob_gpus_current)" \
    "$(metric "$op" tidal_trainingjob_generation)" >>"$out/timeline.tsv"
}

t0=$(date +%s)
grew=0 shrank=0 shrink_step=0
while (( $(date +%s) - t0 < limit_s )); do
  sleep 2
  scrape
  cur=$(k get tj demo -o jsonpath='{.status.gpus.current}' 2>/dev/null || true)
  step=$(k get tj demo -o jsonpath='{.status.step}' 2>/dev/null || true)
  [[ "$cur" == 4 ]] && grew=1
  if (( grew == 1 && shrank == 0 )) && [[ "$cur" == 2 ]]; then shrank=1; shrink_step=${step:-0}; fi
  if (( shrank == 1 )) && (( ${step:-0} >= shrink_step + 15 )); then break; fi
done
kill "$watch_pid" 2>/dev/null || true
watch_pid=""

k logs demo-worker-0 >"$out/rank0.log" 2>/dev/null || true
say "kubectl delete tj demo   (the finalizer takes a final checkpoint first)"
k delete tj demo --timeout=90s || true

say "summary"
if "$root/tools/plot-demo.sh" "$out/timeline.tsv" "$out/rescale.png"; then
  echo "  loss and GPUs over time, as scraped: $out/rescale.png"
fi
k get events -o json >"$out/events.json" 2>/dev/null || echo '{"items":[]}' >"$out/events.json"
python3 - "$out" "$data" "$grew" "$shrank" <<'PY'
import json, os, sys
out, data, grew, shrank = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
steps, ready = [], None
try:
    for line in open(os.path.join(out, "rank0.log")):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("msg") == "step":
            steps.append(j)
        elif j.get("msg") == "training rows" and ready is None:
            ready = j
except OSError:
    pass
events = json.load(open(os.path.join(out, "events.json"))).get("items", [])
interesting = ("PreparingData", "DataReady", "CreatingWorkers", "ScalingUp", "CheckpointBarrier", "Rescaled", "ScalingDown",
               "Rendezvous", "FinalCheckpoint", "ScaleUpAbandoned", "WorkerFailed", "Recovered")
print("  events:")
for e in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
    if e.get("reason") in interesting:
        print("    %s  %-17s %s" % ((e.get("lastTimestamp") or "")[11:19], e["reason"], e.get("message", "")))
if ready:
    print("  data: examples/data/chat.jsonl (messages) -> the data phase (tidal-prep in a prep pod)"
          " -> %s conversations packed"
          " into %s rows of %s tokens (%.0f%% full)" % (ready.get("samples"), ready.get("rows"),
          ready.get("row_tokens"), 100 * ready.get("utilisation", 0)))
if steps:
    wait = sum(s.get("data_wait_s", 0) for s in steps)
    busy = sum(s.get("seconds", 0) for s in steps)
    if busy > 0:
        print("  data-loader wait: %.2f%% of step time (rank 0)" % (100 * wait / busy))
    sizes = []
    for s in steps:
        if not sizes or sizes[-1][0] != s["world_size"]:
            sizes.append((s["world_size"], s["step"]))
    print("  steps: %d (rank 0 logged); world sizes: %s" % (
        steps[-1]["step"], " -> ".join("%d from step %d" % w for w in sizes)))
    print("  loss: %.4f at step %d -> %.4f at step %d" % (
        steps[0]["loss"], steps[0]["step"], steps[-1]["loss"], steps[-1]["step"]))
# The job's store: <root>/<namespace>/<name>/<job uid> (the newest, should the demo have run
# before in this data directory).
base = os.path.join(data, "checkpoints", "default", "demo")
stores = [os.path.join(base, d) for d in os.listdir(base)] if os.path.isdir(base) else []
stores = [d for d in stores if os.path.isdir(d)]
ckpt = max(stores, key=os.path.getmtime) if stores else ""
if ckpt:
    kept = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
    print("  checkpoints kept in %s: %s" % (ckpt, ", ".join(kept)))
print("  grew to 4 GPUs: %s; shrank back to 2: %s" % ("yes" if grew else "NO", "yes" if shrank else "NO"))
print("  everything is in %s (events.json, rank0.log, timeline.tsv, tidal-local.log)" % out)
sys.exit(0 if grew and shrank else 1)
PY
