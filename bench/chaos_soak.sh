#!/usr/bin/env bash
# bench/chaos_soak.sh [BUILD_DIR] [MINUTES_EACH] [SEED...] — the long chaos soak: tidal_chaos
# (tests/e2e/chaos/chaos_main.cc, the program the e2e test runs with each kind once) once per seed, each
# with MINUTES_EACH minutes of faults of every kind (default 10; seeds default 11 12 13: 30
# minutes in all), then one table of the runs together: faults injected and survived by kind,
# seconds to training again (min / median / max), steps recomputed, invariant violations. The
# reference run (the same spec undisturbed) is trained once and kept in out/chaos.
# Each run's table and report stay in out/chaos/seed-N.{log,json}; the run directory of a seed
# with a violation is kept (its path is printed). Exit 1 if any run had a violation.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
minutes=${2:-10}
shift 2 2>/dev/null || shift $#
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(11 12 13)
chaos="$build/tests/tidal_chaos"
[[ -x "$chaos" ]] || { echo "chaos_soak: no $chaos (build first)" >&2; exit 2; }
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "chaos_soak: MINUTES_EACH: expected a positive integer" >&2; exit 2; }
mkdir -p "$root/out/chaos"
failed=0
for seed in "${seeds[@]}"; do
  echo "== seed $seed: $minutes minutes of faults"
  if ! "$chaos" --seed "$seed" --duration $((minutes * 60)) --reference-cache "$root/out/chaos" \
      --json "$root/out/chaos/seed-$seed.json" | tee "$root/out/chaos/seed-$seed.log"; then
    failed=1
  fi
done
"$root/tools/venv/bin/python3" - "$root/out/chaos" "${seeds[@]}" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows, totals = {}, {"steps": 0, "recomputed": 0, "violations": 0, "generations": 0}
for seed in seeds:
    r = json.load(open(f"{out}/seed-{seed}.json"))
    for k in ("steps", "recomputed", "generations"):
        totals[k] += r[k]
    totals["violations"] += len(r["violations"])
    for f in r["faults"]:
        row = rows.setdefault(f["kind"], {"injected": 0, "survived": 0, "back": []})
        row["injected"] += 1
        if f["seconds_to_training"] is not None:
            row["survived"] += 1
            row["back"].append(f["seconds_to_training"])
print(f"\nseeds {' '.join(seeds)}: {sum(r['injected'] for r in rows.values())} faults")
print(f"{'fault':<10} {'injected':>9} {'survived':>9}   seconds to training again (min / median / max)")
for kind in sorted(rows):
    row = rows[kind]
    b = sorted(row["back"])
    span = f"{b[0]:.1f} / {statistics.median(b):.1f} / {b[-1]:.1f}" if b else "-"
    print(f"{kind:<10} {row['injected']:>9} {row['survived']:>9}   {span}")
print(f"steps {totals['steps']}, generations {totals['generations']}, "
      f"steps recomputed {totals['recomputed']}, invariant violations {totals['violations']}")
PY
exit $failed
