# bench/lib/local_job.sh [BUILD_DIR] [ROUNDS] — sourced by the benches that drive jobs on
# `tidal local` with kubectl (rescale_cost.sh, recovery_cost.sh), with their arguments: the
# cluster, the steps rank 0 logs, waits on the status. Sets $build (absolute), $rounds, $root,
# $work, $data, $cluster_pid, $preset; cleans up on exit (KEEP=1 keeps the work directory).
# PRESET=small runs the jobs on the small preset (~100 M parameters) instead of tiny.
build=${1:-build}
preset=${PRESET:-tiny}
[[ "$preset" =~ ^(tiny|small)$ ]] ||
  { echo "$(basename "$0"): PRESET: expected tiny or small, got \"$preset\"" >&2; exit 2; }
rounds=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in /*) ;; *) build="$root/$build" ;; esac
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] ||
  { echo "$(basename "$0"): ROUNDS: expected a positive integer" >&2; exit 2; }
tidal="$build/operator/tidal"
kubectl_bin=$(command -v kubectl || echo "$root/tools/bin/kubectl")
[[ -x "$tidal" ]] || { echo "$(basename "$0"): no $tidal (build first)" >&2; exit 2; }
work=$(mktemp -d /tmp/tidal-bench-XXXXXX)
data="$work/cluster"
k() { "$kubectl_bin" --kubeconfig="$data/kubeconfig" "$@"; }
cluster_pid="" follower_pids=()
cleanup() {
  set +e
  for p in "${follower_pids[@]}"; do kill "$p" 2>/dev/null; done
  if [[ -n "$cluster_pid" ]]; then kill "$cluster_pid"; wait "$cluster_pid"; fi 2>/dev/null
  if [[ -n "${KEEP:-}" ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_cluster GPUS: `tidal local` with the operator, ready for TrainingJobs.
start_cluster() {
  "$tidal" local --data "$data" --gpus "$1" --port 0 >"$work/cluster.out" 2>"$work/tidal-local.log" &
  cluster_pid=$!
  for _ in $(seq 1 150); do grep -q 'export KUBECONFIG' "$work/cluster.out" 2>/dev/null && break; sleep 0.2; done
  grep -q 'export KUBECONFIG' "$work/cluster.out" || { echo "tidal local did not start" >&2; exit 1; }
  for _ in $(seq 1 100); do k get crd trainingjobs.tidal.dev >/dev/null 2>&1 && break; sleep 0.2; done
}

# follow_logs JOB SLOTS OUT: appends every line of the job's worker pods' logs to OUT, followed by
# path through each pod incarnation (a new pod of the same name truncates it).
follow_logs() {
  python3 -u - "$data/logs/default" "$1" "$2" "$3" <<'PY' &
import os, sys, time
root, job, slots, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), open(sys.argv[4], "a")
state = {}  # path -> (inode, offset)
while True:
    for slot in range(slots):
        path = os.path.join(root, f"{job}-worker-{slot}", "worker.log")
        try:
            st = os.stat(path)
        except OSError:
            continue
        inode, offset = state.get(path, (None, 0))
        if inode != st.st_ino or st.st_size < offset:
            inode, offset = st.st_ino, 0
        if st.st_size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            out.write(chunk[:end].decode(errors="replace"))
            out.flush()
            offset += end
        state[path] = (inode, offset)
    time.sleep(0.05)
PY
  follower_pids+=($!)
}

# jp JOB JSONPATH: a field of the job's status ("" while it cannot be read).
jp() { k get tj "$1" -o "jsonpath=$2" 2>/dev/null || true; }

# settle JOB GPUS STEPS: waits until the job trains at GPUS, phase Running, STEPS steps past the
# step it had then.
settle() {
  local job=$1 gpus=$2 extra=$3 deadline=$((SECONDS + 300)) base=""
  while ((SECONDS < deadline)); do
    if [[ "$(jp "$job" '{.status.gpus.current}/{.status.phase}')" == "$gpus/Running" ]]; then
      local step; step=$(jp "$job" '{.status.step}')
      [[ -z "$base" ]] && base=$step
      ((step >= base + extra)) && return 0
    fi
    sleep 0.5
  done
  echo "$(basename "$0"): $job did not settle at $gpus GPUs: $(jp "$job" '{.status}')" >&2
  exit 1
}
now() { date +%s.%N; }
