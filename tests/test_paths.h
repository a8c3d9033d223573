// tests/test_paths.h — where a test finds this clone's checkout, the build's programs and the
// tools: TIDAL_SOURCE_DIR, TIDAL_TRAIN_BIN, KUBECTL_BIN, ... each a C string (const char[]).
//
// A program's target names the ones it uses as compile definitions, but the paths themselves
// are not on the compiler's command line: tidal_test_paths (CMakeLists.txt) turns
// -DTIDAL_SOURCE_DIR="/the/clone" into -DTIDAL_SOURCE_DIR=tidal_path_TIDAL_SOURCE_DIR and defines
// that array in a small source generated for the program. A path on the command line made each
// test source a ccache miss in every new clone of the same commit (CI's: 80 sources, 490 CPU-s
// of a "warm" build). Being arrays, not literals, they concatenate as std::string(X) + "/...".
#pragma once

extern "C" {
extern const char tidal_path_TIDAL_SOURCE_DIR[];
extern const char tidal_path_TIDAL_BUILD_DIR[];
extern const char tidal_path_TIDAL_TEST_CACHE_DIR[];
extern const char tidal_path_TIDAL_BIN[];
extern const char tidal_path_TIDAL_TRAIN_BIN[];
extern const char tidal_path_TIDAL_WORKER_BIN[];
extern const char tidal_path_TIDAL_WORKER_BIN_DIR[];
extern const char tidal_path_TIDAL_PREP_BIN[];
extern const char tidal_path_TIDAL_EXPORT_BIN[];
extern const char tidal_path_TIDAL_CHAOS_BIN[];
extern const char tidal_path_TIDAL_PYTHON[];
extern const char tidal_path_KUBECTL_BIN[];
extern const char tidal_path_HELM_BIN[];
extern const char tidal_path_PROMTOOL_BIN[];
extern const char tidal_path_PROMETHEUS_BIN[];
extern const char tidal_path_LIBFAKETIME[];
extern const char tidal_path_LEASE_CONTENDER_BIN[];
extern const char tidal_path_FAKE_NVML[];
extern const char tidal_path_CTEST_BIN[];
}
