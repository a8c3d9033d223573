#!/usr/bin/env bash
# tools/measure-tests.sh BUILD_DIR REGEX... — runs each ctest test matching a REGEX alone and
# prints it as tests/measured_tests.cmake lists it: "NAME SECONDS CORES", SECONDS its wall time
# (rounded up) and CORES the CPU the whole machine spent meanwhile (/proc/stat) over that wall
# time. Run it on an otherwise idle machine.
set -euo pipefail
build=${1:?usage: tools/measure-tests.sh BUILD_DIR REGEX...}
shift
busy() {  # jiffies the CPUs spent on anything but idle and iowait
  awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat
}
hz=$(getconf CLK_TCK)
for regex in "$@"; do
  for name in $(cd "$build" && ctest -N -R "$regex" | sed -nE 's/^ *Test +#[0-9]+: (.+)$/\1/p'); do
    b0=$(busy)
    t0=$(date +%s.%N)
    if ! (cd "$build" && ctest -R "^${name//./\\.}\$" > /dev/null); then
      echo "tools/measure-tests.sh: $name failed" >&2
      continue
    fi
    t1=$(date +%s.%N)
    b1=$(busy)
    awk -v n="$name" -v w="$(echo "$t1 - $t0" | bc)" -v c="$((b1 - b0))" -v hz="$hz" \
      'BEGIN { s = int(w) + (w > int(w)); printf "  \"%s %d %.2f\"\n", n, s, c / hz / w }'
  done
done
