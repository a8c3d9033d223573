#!/usr/bin/env bash
# tools/test.sh BUILD_DIR [CTEST_ARGS...] — `make test` (and so CI): every test of the ordinary
# build, then the tests without LibTorch again under AddressSanitizer + UBSan (tools/sanitize.sh).
#
# The sanitizer build compiles in the background from the start, at the lowest CPU priority
# (nice 19): it needs only the Debian packages, helm and kubectl (`tools/deps.sh --build-tools`),
# so on a new machine it compiles on one core while the venv unpacks on the other (minutes,
# single-threaded); later it takes the CPU that the ordinary build's link steps and the tests
# leave idle, and gives it back as soon as they want it. Its output goes to out/sanitize-build.log, printed if it
# fails. The ordinary tests run as many at a time as there are cores ($@ may set another -j);
# the long ones start first, and those that keep both cores busy on their own (multi-process
# training, measured) carry PROCESSORS 2 and so run alone (tests/measured_tests.cmake). On
# 2026-12-05 the 910 tests took 1,564 s one at a time (1.14 cores on average); on 2026-12-06, 913
# of them took 1,269 s this way beside the sanitizer build (docs/build-and-test-times.md).
# Exit status: non-zero if either suite or either build failed; both suites run regardless.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: tools/test.sh BUILD_DIR [CTEST_ARGS...]}
shift
mkdir -p out
asan_log=out/sanitize-build.log

# Its own process group (job control), so that an interrupted `make test` stops its compilers
# too; but the same session: with the kernel's autogroup scheduling, a new session (setsid)
# would be a group of its own that shares the CPU equally with this one, whatever its nice.
tools/deps.sh --build-tools
set -m
nice -n 19 tools/sanitize.sh address --build-only > "$asan_log" 2>&1 &
asan_pid=$!
set +m
trap 'kill -- -"$asan_pid" 2>/dev/null || true' EXIT

# The rest of `make deps` (the venv, the fixtures) and the ordinary build's configure step.
"${MAKE:-make}" --no-print-directory configure BUILD_DIR="$build"
status=0
cmake --build "$build" -j "$(nproc)"
(cd "$build" && ctest --output-on-failure --timeout 1200 -j "$(nproc)" "$@") || status=$?

if ! wait "$asan_pid"; then
  echo "tools/test.sh: the sanitizer build failed ($asan_log):" >&2
  tail -n 60 "$asan_log" >&2
  exit 1
fi
trap - EXIT
tools/sanitize.sh address "$@" || status=$?
exit "$status"
