#!/usr/bin/env bash
# bench/operator_scale.sh [BUILD_DIR] [JOBS] [PODS_PER_JOB] [WINDOW_S] — the operator at scale
# on `tidal local`: JOBS TrainingJobs of PODS_PER_JOB pods each (default 200 x 10 = 2,000 pods
# on 20 nodes of 100 GPUs), their workers replaced by sleeping stand-ins (bench/idle_worker.cc: a
# process per pod, blocked in a read) whose control API one hub process serves
# (bench/idle_worker_hub.cc), the operator a process of its own. First a tenth of the jobs (the
# baseline, same run), then all: once every job runs and no pass has run for 5 s (settle), the
# operator is watched for WINDOW_S seconds (default 60) — reconcile duration p50/p99 over every reconcile since that phase's jobs
# went in (from its /metrics histogram, interpolated within buckets as Prometheus'
# histogram_quantile does; a steady job costs none, so its start-up is what is measured), the
# window's reconciles per job per second, work queue depth, its resident memory (and where it
# is: anonymous or file-backed, threads), and the status lag: how far each job's status.step is behind
# its rank 0's step (the hub's, a step a second), sampled every 5 s. Prints both and the ratios
# full / baseline.
set -euo pipefail
# One hub process serves every stand-in's control API: a listening socket per pod and a
# connection per worker the operator follows. At 6,000 pods it ran out of descriptors under a
# limit of 20,000 ("Failed accept4: Too many open files"), its workers went silent and were
# recovered. Raised where the hard limit (or root) allows; a cluster's runtime gives each
# container its own.
ulimit -n 200000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
build=${1:-build}
jobs=${2:-200}
per_job=${3:-10}
window=${4:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in /*) ;; *) build="$root/$build" ;; esac
tidal="$build/operator/tidal"
idle="$build/bench/idle_worker"
hub="$build/bench/idle_worker_hub"
kubectl_bin=$(command -v kubectl || echo "$root/tools/bin/kubectl")
for exe in "$tidal" "$idle" "$hub"; do [[ -x "$exe" ]] || { echo "operator_scale: no $exe (build first)" >&2; exit 2; }; done
for n in "$jobs" "$per_job" "$window"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "operator_scale: expected positive integers, got $n" >&2; exit 2; }
done
base_jobs=$(( jobs / 10 > 0 ? jobs / 10 : 1 ))
nodes=$(( (jobs * per_job + 99) / 100 ))
work=$(mktemp -d /tmp/tidal-scale-bench-XXXXXX)
data="$work/cluster"
k() { "$kubectl_bin" --kubeconfig="$data/kubeconfig" --request-timeout=60s "$@"; }
cluster_pid="" operator_pid="" hub_pid=""
stop() {  # SIGTERM, then SIGKILL after 30 s (a kubelet pass over thousands of pods is long)
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  set +e
  [[ -n "$operator_pid" ]] && stop "$operator_pid"
  [[ -n "$cluster_pid" ]] && stop "$cluster_pid"
  [[ -n "$hub_pid" ]] && stop "$hub_pid"
  # TIDAL_BENCH_KEEP_LOGS=DIR keeps the operator's log (its "slow reconcile" lines say where a
  # slow pass's time went) and tidal local's.
  if [[ -n "${TIDAL_BENCH_KEEP_LOGS:-}" ]]; then
    mkdir -p "$TIDAL_BENCH_KEEP_LOGS" && cp "$work"/*.log "$TIDAL_BENCH_KEEP_LOGS"/
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$hub" --socket "$work/hub.sock" >"$work/hub.out" 2>"$work/hub.log" &
hub_pid=$!
for _ in $(seq 1 50); do [[ -S "$work/hub.sock" ]] && break; sleep 0.1; done
[[ -S "$work/hub.sock" ]] || { echo "idle_worker_hub did not start" >&2; exit 1; }
# The data phase's prep pods run the real tidal-prep (the stand-ins train nothing, but each job
# prepares its store first): the kubelet finds it on its PATH.
PATH="$build/worker:$PATH" "$tidal" local --no-operator --data "$data" --nodes "$nodes" --gpus 100 --port 0 \
  --image "tidal-idle-worker=$idle" >"$work/cluster.out" 2>"$work/tidal-local.log" &
cluster_pid=$!
for _ in $(seq 1 150); do grep -q 'export KUBECONFIG' "$work/cluster.out" 2>/dev/null && break; sleep 0.2; done
grep -q 'export KUBECONFIG' "$work/cluster.out" || { echo "tidal local did not start" >&2; exit 1; }
metrics_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# TIDAL_BENCH_OPERATOR_PREFIX: words put before the operator's command, one that execs it (so its
# pid stays the operator's), e.g. "env LD_PRELOAD=.../libheaptrack_preload.so
# DUMP_HEAPTRACK_OUTPUT=FIFO" to see where its memory goes.
# shellcheck disable=SC2086
${TIDAL_BENCH_OPERATOR_PREFIX:-} "$tidal" operator --kubeconfig "$data/kubeconfig" --install-crd --no-leader-elect \
  --metrics-address "127.0.0.1:$metrics_port" --default-checkpoint-root "file://$work/ckpt" \
  2>"$work/operator.log" &
operator_pid=$!
for _ in $(seq 1 100); do k get crd trainingjobs.tidal.dev >/dev/null 2>&1 && break; sleep 0.2; done

# JOBS jobs from $1 to $2 (names scale-NNN), min = max = PODS_PER_JOB GPUs, 1 GPU per pod.
make_jobs() {
  local i
  for i in $(seq "$1" "$2"); do
    cat <<YAML
---
apiVersion: tidal.dev/v1alpha1
kind: TrainingJob
metadata: {name: scale-$(printf %03d "$i")}
spec:
  model: {preset: tiny}
  dataset: {uri: "$root/examples/data/sample.jsonl", format: text, maxSeqLen: 32}
  optimization: {globalBatchSize: $((per_job * 2)), microBatchSize: 2, maxSteps: 1000000}
  elastic: {minGPUs: $per_job, maxGPUs: $per_job, gpusPerPod: 1}
  worker: {image: tidal-idle-worker, env: [{name: TIDAL_IDLE_HUB, value: "$work/hub.sock"}]}
YAML
  done
}
running() { k get tj -o 'jsonpath={range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c '^Running$' || true; }
wait_running() {
  local want=$1 deadline=$((SECONDS + 1200)) n=0
  while ((SECONDS < deadline)); do
    n=$(running)
    ((n >= want)) && return 0
    echo "  $n of $want jobs running ($(k get pods --no-headers 2>/dev/null | wc -l) pods)" >&2
    sleep 5
  done
  echo "operator_scale: only $n of $want jobs reached Running" >&2
  exit 1
}
scrape() { curl -s "http://127.0.0.1:$metrics_port/metrics"; }
# One sample of every job's status lag in seconds, a line each, appended to $1: rank 0's step
# as the hub reports it (after `kubectl get tj`, less the time since that answer, a step a
# second) less status.step. Over-states by at most the `get`'s own duration, printed beside it.
lag_sample() {
  python3 - "$work/hub.sock" "$kubectl_bin" "$data/kubeconfig" >>"$1" <<'PY'
import json, socket, subprocess, sys, time
sock, kubectl, kubeconfig = sys.argv[1:4]
k = [kubectl, "--kubeconfig=" + kubeconfig, "--request-timeout=60s", "get", "-o", "json"]
pods = json.loads(subprocess.run(k + ["pods"], capture_output=True, text=True).stdout or "{}")
job_of = {p["status"].get("podIP"): p["metadata"].get("labels", {}).get("tidal.dev/job")
          for p in pods.get("items", [])}
t0 = time.monotonic()
jobs = json.loads(subprocess.run(k + ["tj"], capture_output=True, text=True).stdout or "{}")
t1 = time.monotonic()
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
s.sendall(b"STEPS\n")
buf = b""
while not buf.endswith(b"END\n"):
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
t2 = time.monotonic()
rank0 = {}  # job -> (generation, step) of its rank 0, newest generation
for line in buf.decode().splitlines():
    parts = line.split()
    if len(parts) != 4:
        continue
    job = job_of.get(parts[0].rsplit(":", 1)[0])
    generation, rank, step = int(parts[1]), int(parts[2]), int(parts[3])
    if job and rank == 0 and step >= 0 and (job not in rank0 or generation > rank0[job][0]):
        rank0[job] = (generation, step)
for j in jobs.get("items", []):
    name, st = j["metadata"]["name"], j.get("status", {})
    if st.get("phase") != "Running" or name not in rank0:
        continue
    worker_then = rank0[name][1] - (t2 - t1)
    print(f"{max(0.0, worker_then - st.get('step', 0)):.2f} {t1 - t0:.2f}")
PY
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$operator_pid/status"; }
# Watches the operator for the window; writes "jobs pods p50 p99 rate depth rss_mib".
measure() {
  local label=$1 njobs=$2
  scrape >"$work/$label.before"
  local t0=$SECONDS depth_max=0 rss_max=0
  while ((SECONDS - t0 < window)); do
    sleep 5
    lag_sample "$work/$label.lags"
    local d r
    d=$(scrape | awk '/^tidal_operator_workqueue_depth / {print int($2)}')
    r=$(rss_kib)
    ((d > depth_max)) && depth_max=$d
    ((r > rss_max)) && rss_max=$r
  done
  scrape >"$work/$label.after"
  # Where the resident memory is: anonymous (heap, stacks) or file-backed (code), and threads.
  awk '/^(RssAnon|RssFile|Threads)/ {printf "%s %s %s  ", $1, $2, $3} END {print ""}' \
    "/proc/$operator_pid/status" | sed "s/^/  $label operator: /"
  python3 - "$work/$label.before" "$work/$label.after" "$label" "$njobs" \
    "$(k get pods --no-headers | wc -l)" "$((SECONDS - t0))" "$depth_max" "$rss_max" \
    "$work/$label.lags" "$work/$label.ramp" <<'PY'
import sys, re
# A histogram's cumulative buckets from a scrape: `series` one of its label pairs.
def buckets(path, series='result="ok"', name="tidal_operator_reconcile_duration_seconds"):
    out = {}
    for line in open(path):
        m = re.match(name + r'_bucket\{([^}]*)\} (\S+)', line)
        if not m or series not in m.group(1):
            continue
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        out[float("inf") if le == "+Inf" else float(le)] = float(m.group(2))
    return out
# A quantile of what a histogram counted between two scrapes (interpolated within buckets, as
# Prometheus' histogram_quantile does).
def quantile(q, before, after):
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0) for b in bounds]
    if not cum or cum[-1] <= 0:
        return 0.0
    rank, prev_bound, prev = q * cum[-1], 0.0, 0.0
    for bound, c in zip(bounds, cum):
        if c >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev) / max(c - prev, 1e-9)
        prev_bound, prev = bound, c
    return bounds[-2]
# The window's reconciles (a steady job should cost none), and the quantiles of every reconcile
# since this phase's jobs went in (their start-up is where the reconciles are). A pass that
# decided (result "ok"); "awaiting": one that only asked the workers (it ends at once, and is
# counted apart so that it does not thin out the quantiles of the passes that decide).
b0, b1, ramp = buckets(sys.argv[1]), buckets(sys.argv[2]), buckets(sys.argv[10])
a0, a1, aramp = (buckets(sys.argv[i], 'result="awaiting"') for i in (1, 2, 10))
inf = float("inf")
total = b1.get(inf, 0) - b0.get(inf, 0) + a1.get(inf, 0) - a0.get(inf, 0)
awaiting = a1.get(inf, 0) - aramp.get(inf, 0)
ramp_total = b1.get(inf, 0) - ramp.get(inf, 0)
# What the API server's answers took meanwhile (a pass that writes waits for one): status
# writes are PUTs, the patcher's figures PATCHes, creations POSTs.
api = {}
for verb in ("put", "patch", "post"):
    name = "tidal_operator_api_request_duration_seconds"
    before, after = buckets(sys.argv[10], f'verb="{verb}"', name), buckets(sys.argv[2], f'verb="{verb}"', name)
    api[verb] = (quantile(0.5, before, after), quantile(0.99, before, after))
# A plan's writes run after its pass (its status first): from the pass's end to their last answer.
name = "tidal_operator_plan_writes_duration_seconds"
before, after = buckets(sys.argv[10], 'result="ok"', name), buckets(sys.argv[2], 'result="ok"', name)
plan_writes = (quantile(0.5, before, after), quantile(0.99, before, after))
label, njobs, pods, secs, depth, rss = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
p50, p99 = quantile(0.5, ramp, b1), quantile(0.99, ramp, b1)
rate = total / secs / njobs
lags, gets = [], []
try:
    for line in open(sys.argv[9]):
        lag, get = map(float, line.split())
        lags.append(lag)
        gets.append(get)
except FileNotFoundError:
    pass
lags.sort()
def pick(q):
    return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")
lag50, lag99 = pick(0.5), pick(0.99)
print(f"{label:<9} {njobs:>5} jobs {pods:>5} pods: reconcile p50 {p50*1000:7.1f} ms  p99 {p99*1000:7.1f} ms  "
      f"(all {int(ramp_total)} that decided since the jobs went in, and {int(awaiting)} that only "
      f"asked the workers); steady: {int(total)} in {secs:.0f} s, "
      f"{rate:5.3f} reconciles/job/s  queue depth <= {depth:4d}  "
      f"RSS {rss/1024:6.1f} MiB  status lag p50 {lag50:.2f} s p99 {lag99:.2f} s "
      f"({len(lags)} samples; a `kubectl get tj` took up to {max(gets or [0]):.2f} s); "
      "API answers p50/p99: " + ", ".join(f"{v} {a[0]*1000:.1f}/{a[1]*1000:.1f} ms" for v, a in api.items()) +
      f"; a plan's writes, after its pass: p50 {plan_writes[0]*1000:.1f} ms p99 {plan_writes[1]*1000:.1f} ms")
with open(f"{sys.argv[1]}.result", "w") as f:
    f.write(f"{p50} {p99} {rate} {rss}\n")
PY
}

# Every reconcile so far (any result), from the duration histogram's counts.
passes() { scrape | awk '/^tidal_operator_reconcile_duration_seconds_count/ {n += $2} END {print n + 0}'; }
# A job reaches Running a second or two before it is steady (its workers' first pushes come, the
# operator then follows rank 0 alone): the window starts once no pass has run for 5 s (60 s at
# most, and says so), so that it measures steady jobs, not the last ones' start-up.
settle() {
  local t0=$SECONDS last quiet=0 n
  last=$(passes)
  while ((quiet < 5 && SECONDS - t0 < 60)); do
    sleep 1
    n=$(passes)
    if [[ "$n" == "$last" ]]; then quiet=$((quiet + 1)); else quiet=0 last=$n; fi
  done
  if ((quiet < 5)); then
    echo "  reconciles went on for 60 s after every job ran: measuring anyway" >&2
  else
    echo "  settled: no pass for 5 s, $((SECONDS - t0 - 5)) s after every job ran" >&2
  fi
}
# Jobs go in in batches of the baseline's size, each running before the next, so the pods of
# one batch start while the machine is not also starting hundreds of others.
add_jobs() {
  local from=$1 to=$2 i
  for ((i = from; i <= to; i += base_jobs)); do
    local last=$((i + base_jobs - 1 < to ? i + base_jobs - 1 : to))
    make_jobs "$i" "$last" | k apply -f - >/dev/null
    wait_running "$last"
  done
}
echo "baseline: $base_jobs jobs x $per_job pods" >&2
scrape >"$work/baseline.ramp"
add_jobs 1 "$base_jobs"
settle
measure baseline "$base_jobs"
echo "full: $jobs jobs x $per_job pods" >&2
scrape >"$work/full.ramp"
add_jobs $((base_jobs + 1)) "$jobs"
settle
measure full "$jobs"
read -r b50 b99 brate brss <"$work/baseline.before.result"
read -r f50 f99 frate frss <"$work/full.before.result"
python3 -c "
b50,b99,brate,brss,f50,f99,frate,frss=map(float,'$b50 $b99 $brate $brss $f50 $f99 $frate $frss'.split())
r = lambda a, b: f'{a/b:.2f}x' if b > 0 else 'n/a'
print(f'ratio full/baseline ({$jobs}/{$base_jobs} jobs): p50 {r(f50,b50)}  p99 {r(f99,b99)}  '
      f'reconciles per job {r(frate,brate)}  RSS {r(frss,brss)}')"
