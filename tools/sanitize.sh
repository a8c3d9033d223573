#!/usr/bin/env bash
# tools/sanitize.sh address|thread [CTEST_ARGS...] — the tests again under a sanitizer, in a
# build of their own without LibTorch (its wheel is not instrumented; the engine's tests run in
# the ordinary build):
#   address (`make sanitize`, part of `make test`): AddressSanitizer + LeakSanitizer + UBSan over
#     every test of that build — unit, integration and e2e: `tidal local`, the operator's client
#     library, object stores, tokenizers, templates, the fuzz corpora — in build-asan/.
#   thread (`make tsan`): ThreadSanitizer over the tests of the code that shares memory between
#     threads — the work queue, informer, watcher, leader election, events, thread pool, HTTP
#     server, object stores, the checkpoint repository's parallel shard writes and reads, the
#     token store's writer and loader — in build-tsan/. (The worker runtime and the trainer's
#     checkpoint writer live in LibTorch code, which this build leaves out.)
# Any finding fails the test that made it (the report is in its output).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:?usage: tools/sanitize.sh address|thread [--build-only] [CTEST_ARGS...]}
shift
build_only=false
if [[ ${1:-} == --build-only ]]; then  # tools/test.sh builds it beside the ordinary tests
  build_only=true
  shift
fi
case $mode in
  address)
    build=${SANITIZE_BUILD_DIR:-build-asan}
    select=()
    # clang (Debian's, there for `make fuzz`): a third of GCC's compile time under ASan + UBSan,
    # and a second compiler over the same tests (it found three tests that passed a one-element
    # braced list to a json parameter, which GCC reads as an array and clang as the element).
    compilers=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
    ;;
  thread)
    build=${TSAN_BUILD_DIR:-build-tsan}
    compilers=()
    select=(-R '(^|/)(WorkQueue|BucketRateLimiter|Informer[A-Za-z]*|Watcher[A-Za-z]*|LeaderElection[A-Za-z]*|DecideLease|Event[A-Za-z]*|ThreadPool|HttpTls|FileStoreTest|S3StoreTest|StoreConformance|RepositoryTest|TokenStoreTest|LoaderTest)\.')
    ;;
  *)
    echo "tools/sanitize.sh: mode \"$mode\": expected address or thread" >&2
    exit 2
    ;;
esac

# A build directory configured with another compiler (before address moved to clang) starts over.
if [[ -f $build/CMakeCache.txt && ${#compilers[@]} -gt 0 ]] &&
  ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIDAL_SANITIZE="$mode" \
    "${compilers[@]}" -DTIDAL_WITH_ENGINE=OFF -DTIDAL_REQUIRE_GRPC=ON >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
$build_only && exit 0

# Findings stop the program with a report; leaks are findings. The symbolizer names file:line.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
cd "$build"
# In parallel: these tests are single processes or a few (measured: the address suite in 5 min 41 s
# with -j 2 against 12 min 17 s one at a time, all passing); $@ may set another -j.
ctest --output-on-failure --timeout 1200 -j "$(nproc)" "${select[@]}" "$@"
