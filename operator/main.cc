// operator/main.cc — the `tidal` command. Subcommands:
//   tidal local [--data DIR] [--port P] [--nodes K] [--gpus N] [--image I=EXE]   the local cluster
// (the operator itself arrives with its issue).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log.h"
#include "operator/local/cluster.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int Usage(const char* why) {
  if (why) std::fprintf(stderr, "tidal: %s\n", why);
  std::fprintf(stderr,
               "usage: tidal local [--data DIR] [--port P] [--nodes K] [--gpus N]\n"
               "                   [--image IMAGE=EXECUTABLE]...\n"
               "  --data DIR   state, certificates, kubeconfig and logs (default .tidal/local)\n"
               "  --port P     HTTPS port on 127.0.0.1 (default: the previous one, else free)\n"
               "  --nodes K    process-kubelet nodes (default 1)\n"
               "  --gpus N     allocatable nvidia.com/gpu per node (default 8)\n"
               "  --image IMAGE=EXECUTABLE  run pods of IMAGE as EXECUTABLE (IMAGE=host: the\n"
               "               container command from the host PATH); repeatable\n");
  return 2;
}

bool ParseInt(const char* text, int& out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (!*text || *end || v < -1 || v > 1 << 20) return false;
  out = static_cast<int>(v);
  return true;
}

int RunLocal(int argc, char** argv) {
  tidal::local::ClusterOptions options;
  for (int i = 0; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) return Usage(("missing value for " + flag).c_str());
    const char* value = argv[++i];
    if (flag == "--data") {
      options.data_dir = value;
    } else if (flag == "--port") {
      if (!ParseInt(value, options.port) || options.port > 65535)
        return Usage("--port: expected a port number 0-65535");
    } else if (flag == "--nodes") {
      if (!ParseInt(value, options.nodes) || options.nodes < 1)
        return Usage("--nodes: expected a positive integer");
    } else if (flag == "--gpus") {
      if (!ParseInt(value, options.gpus_per_node) || options.gpus_per_node < 0)
        return Usage("--gpus: expected a non-negative integer");
    } else if (flag == "--bookmark-interval-ms") {  // for tests
      int ms = 0;
      if (!ParseInt(value, ms) || ms < 1) return Usage("--bookmark-interval-ms: expected > 0");
      options.bookmark_interval = std::chrono::milliseconds(ms);
    } else if (flag == "--image") {
      options.images.push_back(value);
    } else if (flag == "--crash-backoff-ms") {  // for tests: CrashLoopBackOff's first delay
      int ms = 0;
      if (!ParseInt(value, ms) || ms < 0) return Usage("--crash-backoff-ms: expected >= 0");
      options.crash_backoff = std::chrono::milliseconds(ms);
    } else if (flag == "--history") {  // for tests: watch window in changes
      int n = 0;
      if (!ParseInt(value, n) || n < 1) return Usage("--history: expected > 0");
      options.history_size = static_cast<size_t>(n);
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto cluster = tidal::local::LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tidal local: %s\n", cluster.status().message().c_str());
    return 1;
  }
  tidal::Logger::Get().Log(
      "info", "tidal local is serving",
      {{"port", (*cluster)->port()}, {"kubeconfig", (*cluster)->kubeconfig_path()}});
  std::printf("export KUBECONFIG=%s\n", (*cluster)->kubeconfig_path().c_str());
  std::fflush(stdout);
  while (!g_stop) pause();
  tidal::Logger::Get().Log("info", "tidal local is stopping", {});
  (*cluster)->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(nullptr);
  std::string command = argv[1];
  if (command == "local") return RunLocal(argc - 2, argv + 2);
  if (command == "--help" || command == "-h" || command == "help") return Usage(nullptr) & 0;
  return Usage(("unknown command " + command).c_str());
}
