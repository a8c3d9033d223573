#!/usr/bin/env bash
# tools/fuzz.sh [SECONDS] [TARGET...] — `make fuzz`: builds the libFuzzer targets of fuzz/ with
# clang (ASan + UBSan, build-fuzz/) and runs each for SECONDS (default 60), FUZZ_JOBS at a time
# (default: one per core). Each run starts from the committed seeds (fuzz/corpus/<target>/, plus
# the chat templates of tools/fixtures for chat_template) and keeps what it learns in
# out/fuzz/<target>/corpus, so the next run goes on from there. Prints a table (seconds, inputs
# tried, corpus size, result), appends it to out/fuzz/history.tsv, and exits 1 when a target
# found something: the input is out/fuzz/<target>/crash-* (or leak-*, timeout-*, oom-*); fix the
# bug and commit the input to fuzz/corpus/<target>/ so every build replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(sed -n 's/^tidal_fuzz_target(\([a-z_0-9]*\) .*/\1/p' fuzz/CMakeLists.txt)
fi
for t in "${targets[@]}"; do
  [[ -d fuzz/corpus/$t ]] || { echo "fuzz.sh: no target \"$t\" (fuzz/corpus/$t is missing)" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (make deps installs it)" >&2; exit 2; }
if [[ ! -f $build/build.ninja ]]; then
  CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIDAL_FUZZ=ON \
    -DTIDAL_WITH_ENGINE=OFF -DTIDAL_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/%/_fuzz}"

mkdir -p out/fuzz
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
run_one() {
  local t=$1 seconds=$2 build=$3
  local dir=out/fuzz/$t
  mkdir -p "$dir/corpus"
  rm -f "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*
  local extra=()
  if [[ $t == chat_template ]]; then
    extra=(tools/fixtures/trl-*/trl/chat_templates)
    [[ -d ${extra[0]} ]] || extra=()
  fi
  # -timeout: one input taking 10 s is a finding (a template or parser that hangs); the RSS
  # limit likewise for one that eats memory.
  "$build/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$dir/" \
    "$dir/corpus" "fuzz/corpus/$t" "${extra[@]}" >"$dir/log" 2>&1
  echo "$?" >"$dir/exit"
}
export -f run_one
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c "run_one {} $seconds $build"

found=0
when=$(date -u +%Y-%m-%dT%H:%M:%SZ)
printf '%-20s %8s %14s %8s  %s\n' target seconds inputs corpus result
for t in "${targets[@]}"; do
  dir=out/fuzz/$t
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  corpus=$(find "$dir/corpus" -type f | wc -l)
  finding=$(find "$dir" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
    -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | head -1)
  if [[ -n $finding ]]; then
    result="FOUND $finding"
    found=1
  elif [[ $(cat "$dir/exit") != 0 ]]; then
    result="FAILED (exit $(cat "$dir/exit"), see $dir/log)"
    found=1
  else
    result=ok
  fi
  printf '%-20s %8s %14s %8s  %s\n' "$t" "$seconds" "${execs:-0}" "$corpus" "$result"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$when" "$t" "$seconds" "${execs:-0}" "$corpus" "$result" \
    >>out/fuzz/history.tsv
done
if [[ $found == 1 ]]; then
  echo "fuzz.sh: findings above; each log is out/fuzz/<target>/log" >&2
  exit 1
fi
