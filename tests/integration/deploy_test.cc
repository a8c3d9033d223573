// deploy/: the Dockerfiles against the binaries this build makes (multi-stage on Debian, a
// non-root user, a runtime stage that installs the package of every shared library the binary
// names or copies it from the wheels the build stage installed, a build stage given enough
// source to configure), and the kustomize manifests (the
// chart rendered with its defaults, current, and buildable by `kubectl kustomize`).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kRoot = TIDAL_SOURCE_DIR;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A Dockerfile's instructions, continuation lines joined, comments dropped, by stage.
struct Stage {
  std::string from;
  std::vector<std::pair<std::string, std::string>> instructions;  // (INSTRUCTION, rest)
};

std::vector<Stage> ParseDockerfile(const std::string& path) {
  std::vector<Stage> stages;
  std::istringstream in(ReadAll(path));
  std::string line, joined;
  auto add = [&](const std::string& text) {
    auto w = Words(text);
    if (w.empty()) return;
    std::string rest = text.substr(text.find(w[0]) + w[0].size());
    if (w[0] == "FROM") stages.push_back({w[1], {}});
    if (!stages.empty()) stages.back().instructions.push_back({w[0], rest});
  };
  while (std::getline(in, line)) {
    auto first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line[first] == '#') continue;
    if (!line.empty() && line.back() == '\\') {
      joined += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    add(joined + line);
    joined.clear();
  }
  add(joined);
  return stages;
}

// The packages an `apt-get install` in the stage names.
std::set<std::string> AptPackages(const Stage& stage) {
  std::set<std::string> out;
  for (const auto& [op, rest] : stage.instructions) {
    if (op != "RUN") continue;
    bool in_install = false;
    for (const auto& w : Words(rest)) {
      if (w == "&&") in_install = false;
      if (in_install && w[0] != '-') out.insert(w);
      if (w == "install") in_install = true;
    }
  }
  return out;
}

// Where the shared libraries `binary` names (DT_NEEDED) come from: a Debian package (from dpkg),
// or a PyPI wheel (the torch wheel's LibTorch, the CUDA wheels), as "site-packages/<dir>".
struct NeededLibraries {
  std::set<std::string> packages;
  std::set<std::string> wheel_dirs;
};
NeededLibraries Needed(const std::string& binary) {
  const std::string script =
      "for lib in $(readelf -d \"$0\" | sed -n 's/.*Shared library: \\[\\(.*\\)\\]/\\1/p'); do "
      "  path=$(ldd \"$0\" | awk -v l=\"$lib\" '$1==l{print $3}'); real=$(readlink -f \"$path\");"
      "  case \"$real\" in */site-packages/*) d=${real#*/site-packages/};"
      "    echo \"site-packages/${d%/*}\"; continue ;; esac;"
      "  pkg=$(dpkg -S \"$real\" 2>/dev/null || dpkg -S \"${real#/usr}\" 2>/dev/null) ||"
      "    { echo \"no package owns $lib ($real)\" >&2; exit 1; };"
      "  echo \"${pkg%%:*}\"; "
      "done";
  ProcessResult r = RunProcess({"/bin/sh", "-c", script, binary}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  NeededLibraries out;
  for (const auto& w : Words(r.out)) {
    if (w.rfind("site-packages/", 0) == 0)
      out.wheel_dirs.insert(w);
    else
      out.packages.insert(w);
  }
  return out;
}

void ExpectARealImage(const std::string& dockerfile, const std::string& binary) {
  SCOPED_TRACE(dockerfile);
  const auto stages = ParseDockerfile(kRoot + "/deploy/docker/" + dockerfile);
  ASSERT_GE(stages.size(), 2u) << "not multi-stage";
  for (const auto& s : stages)
    EXPECT_EQ(s.from.rfind("debian:", 0), 0u) << "FROM " << s.from << " is not Debian";
  const Stage& runtime = stages.back();
  EXPECT_NE(runtime.from.find("-slim"), std::string::npos) << runtime.from;

  // A numeric non-root user, the one the chart's pods run as.
  std::string user;
  for (const auto& [op, rest] : runtime.instructions)
    if (op == "USER") user = Words(rest)[0];
  EXPECT_EQ(user, "65532:65532");
  EXPECT_NE(ReadAll(kRoot + "/charts/tidal/values.yaml").find("runAsUser: 65532"),
            std::string::npos);

  // What debian:bookworm-slim has already (apt itself needs them).
  const std::set<std::string> base = {"libc6", "libgcc-s1", "libstdc++6"};
  const auto installed = AptPackages(runtime);
  const NeededLibraries libraries = Needed(binary);
  const auto& needed = libraries.packages;
  ASSERT_FALSE(needed.empty());
  // A wheel's libraries: the runtime stage copies their directory from the build stage, at the
  // path the binary was linked against, and the build stage installs the wheels at the
  // versions tools/requirements.txt pins (it reads that file).
  std::vector<std::string> copied;
  for (const auto& [op, rest] : runtime.instructions) {
    auto w = Words(rest);
    if (op == "COPY" && w.size() == 3 && w[0] == "--from=build") copied.push_back(w[1]);
  }
  for (const auto& dir : libraries.wheel_dirs) {
    bool found = false;
    for (const auto& from : copied) {
      const auto at = from.find("site-packages/");
      if (at != std::string::npos && dir.rfind(from.substr(at), 0) == 0) found = true;
    }
    EXPECT_TRUE(found) << binary << " needs libraries from " << dir
                       << ", which the runtime stage does not copy from the build stage";
  }
  if (!libraries.wheel_dirs.empty()) {
    std::string build_runs;
    for (const auto& [op, rest] : stages.front().instructions)
      if (op == "RUN") build_runs += rest;
    EXPECT_NE(build_runs.find("tools/requirements.txt"), std::string::npos)
        << "the build stage does not install the wheels from tools/requirements.txt";
  }
  for (const auto& pkg : needed)
    EXPECT_TRUE(base.count(pkg) || installed.count(pkg))
        << binary << " needs a library of " << pkg << ", which the runtime stage does not install";
  for (const auto& pkg : installed)
    EXPECT_TRUE(needed.count(pkg) || pkg == "ca-certificates" || pkg == "tzdata")
        << "the runtime stage installs " << pkg << ", which " << binary << " does not need";

  // The build stage's COPYs are enough source for its own cmake line (its -D options) to
  // configure; TIDAL_REQUIRE_GRPC=ON makes a missing gRPC an error, not a build without the
  // operator.
  std::string configure_flags;
  for (const auto& [op, rest] : stages.front().instructions)
    if (op == "RUN" && rest.find("cmake -S") != std::string::npos)
      for (const auto& w : Words(rest))
        if (w.rfind("-D", 0) == 0) configure_flags += " " + w;
  EXPECT_NE(configure_flags.find("-DTIDAL_REQUIRE_GRPC=ON"), std::string::npos) << configure_flags;
  EXPECT_NE(configure_flags.find("-DTIDAL_BUILD_TESTS=OFF"), std::string::npos) << configure_flags;
  const fs::path copy = fs::path(::testing::TempDir()) / ("deploy-test-" + dockerfile);
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (const auto& [op, rest] : stages.front().instructions) {
    if (op != "COPY") continue;
    auto w = Words(rest);
    ASSERT_EQ(w.size(), 2u) << "COPY " << rest;
    const fs::path to = copy / (w[1] == "./" ? w[0] : w[1]);
    fs::create_directories(to.parent_path());
    fs::copy(kRoot + "/" + w[0], to, fs::copy_options::recursive);
  }
  // The build stage's environment, as its ENV lines set it (the worker's TIDAL_PYTHON names
  // the image's torch; here, this build's).
  std::string env = "TIDAL_PYTHON=" + std::string(TIDAL_PYTHON) + " ";
  ProcessResult r = RunProcess(
      {"/bin/sh", "-c", env + "cmake -S \"$0\" -B \"$0/build\" -G Ninja " + configure_flags,
       copy.string()},
      300s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  fs::remove_all(copy);
}

TEST(Dockerfiles, TheOperatorImageIsMultiStageDebianNonRootWithEveryLibraryTidalNeeds) {
  ExpectARealImage("operator.Dockerfile", TIDAL_BIN);
}

TEST(Dockerfiles, TheWorkerImageIsMultiStageDebianNonRootWithEveryLibraryTheWorkerNeeds) {
  ExpectARealImage("worker.Dockerfile", TIDAL_WORKER_BIN);
}

TEST(KustomizeManifests, AreTheChartRenderedWithItsDefaultsAndCurrent) {
  const std::string fresh = ::testing::TempDir() + "/rendered-tidal.yaml";
  ProcessResult r = RunProcess({"/usr/bin/env", std::string("HELM=") + HELM_BIN,
                                kRoot + "/tools/render-manifests.sh", fresh},
                               60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(ReadAll(fresh) == ReadAll(kRoot + "/deploy/kustomize/base/tidal.yaml"))
      << "deploy/kustomize/base/tidal.yaml is stale: run `make manifests`";
  fs::remove(fresh);
}

TEST(KustomizeManifests, BuildWithKubectlKustomizeIntoTheTidalSystemNamespace) {
  ProcessResult r = RunProcess({KUBECTL_BIN, "kustomize", kRoot + "/deploy/kustomize/base"}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"kind: Namespace", "kind: CustomResourceDefinition", "kind: ClusterRole",
                           "kind: Deployment", "name: trainingjobs.tidal.dev",
                           "name: POD_NAMESPACE", "grafana_dashboard: \"1\""})
    EXPECT_NE(r.out.find(want), std::string::npos) << want;
}

}  // namespace
}  // namespace tidal::testing
