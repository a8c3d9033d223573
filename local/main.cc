// local/main.cc — `tidal-local` (also run as `tidal local`): a Kubernetes-API-compatible
// cluster in one process (local/cluster.h: the API server, the process kubelet), running the
// operator in-process (and installing the CRD) unless --no-operator.
//   tidal-local [--data DIR] [--port P] [--nodes K] [--gpus N] [--image I=EXE] [--no-operator]
//               [--keep-logs] [--operator-metrics-address ADDR] [--audit-log PATH]
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/log.h"
#include "local/cluster.h"
#ifdef TIDAL_WITH_OPERATOR  // gRPC found: the operator is built (a GPU host may lack it)
#include "operator/controller/manager.h"
#endif

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// The usage on stderr, exit status 2 (a bad invocation), or with --help on stdout, status 0.
int Usage(const char* why, bool help = false) {
  if (why) std::fprintf(stderr, "tidal local: %s\n", why);
  std::fprintf(help ? stdout : stderr,
               "usage: tidal local [--data DIR] [--port P] [--nodes K] [--gpus N]\n"
               "                   [--image IMAGE=EXECUTABLE]...\n"
               "       (tidal-local takes the same flags)\n"
               "  --data DIR   state, certificates, kubeconfig and logs (default .tidal/local)\n"
               "  --port P     HTTPS port on 127.0.0.1 (default: the previous one, else free)\n"
               "  --nodes K    process-kubelet nodes (default 1)\n"
               "  --gpus N     allocatable nvidia.com/gpu per node (default 8)\n"
               "  --image IMAGE=EXECUTABLE  run pods of IMAGE as EXECUTABLE (IMAGE=host: the\n"
               "               container command from the host PATH); repeatable\n"
               "  --no-operator  serve the cluster only (tests that run their own operator)\n"
               "  --operator-metrics-address HOST:PORT  the operator's /metrics (default\n"
               "               127.0.0.1:0, a free port: written to DIR/operator-metrics-port)\n"
               "  --audit-log PATH  append each API request to PATH as an audit.k8s.io/v1 Event\n"
               "  --keep-logs  keep every container run's output, after its pod is gone too,\n"
               "               under DIR/logs-archive/<namespace>/<pod>/\n"
               "  --worker-unreachable-seconds S  the operator's --worker-unreachable-timeout\n"
               "               (default 30)\n");
  return help ? 0 : 2;
}

bool IsHelp(const std::string& flag) { return flag == "--help" || flag == "-h"; }

bool ParseInt(const char* text, int& out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (!*text || *end || v < -1 || v > 1 << 20) return false;
  out = static_cast<int>(v);
  return true;
}

int RunLocal(int argc, char** argv) {
  tidal::local::ClusterOptions options;
  bool run_operator = true;
  std::string metrics_address = "127.0.0.1:0";
  std::optional<std::chrono::seconds> unreachable_after;
  for (int i = 0; i < argc; ++i) {
    std::string flag = argv[i];
    if (IsHelp(flag)) return Usage(nullptr, /*help=*/true);
    if (flag == "--no-operator") {
      run_operator = false;
      continue;
    }
    if (flag == "--keep-logs") {
      options.keep_logs = true;
      continue;
    }
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
    } else if (flag == "--audit-log") {
      options.audit_log_path = value;
    } else if (flag == "--operator-metrics-address") {
      metrics_address = value;
    } else if (flag == "--crash-backoff-ms") {  // for tests: CrashLoopBackOff's first delay
      int ms = 0;
      if (!ParseInt(value, ms) || ms < 0) return Usage("--crash-backoff-ms: expected >= 0");
      options.crash_backoff = std::chrono::milliseconds(ms);
    } else if (flag == "--worker-unreachable-seconds") {
      int seconds = 0;
      if (!ParseInt(value, seconds) || seconds < 1)
        return Usage("--worker-unreachable-seconds: expected a positive number of seconds");
      unreachable_after = std::chrono::seconds(seconds);
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
#ifdef TIDAL_WITH_OPERATOR
  std::unique_ptr<tidal::controller::Manager> manager;
  if (run_operator) {
    auto connection = tidal::kube::LoadKubeconfig((*cluster)->kubeconfig_path());
    if (!connection.ok()) {
      std::fprintf(stderr, "tidal local: %s\n", connection.status().message().c_str());
      return 1;
    }
    tidal::controller::ManagerOptions m;
    m.connection = *connection;
    m.install_crd = true;
    m.lease_namespace = "kube-system";
    m.controller.default_checkpoint_root =
        "file://" + std::filesystem::absolute(options.data_dir).string() + "/checkpoints";
    m.metrics_address = metrics_address;
    if (unreachable_after) m.controller.reconcile.unreachable_after = *unreachable_after;
    auto started = tidal::controller::Manager::Start(std::move(m));
    if (!started.ok()) {
      std::fprintf(stderr, "tidal local: the operator: %s\n", started.status().message().c_str());
      return 1;
    }
    manager = std::move(*started);
    if (manager->metrics_port() > 0) {  // for scrapers started after this (tests, make demo)
      const std::string path = options.data_dir + "/operator-metrics-port";
      if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
        std::fprintf(f, "%d\n", manager->metrics_port());
        std::fclose(f);
        std::rename((path + ".tmp").c_str(), path.c_str());
      }
    }
  }
#else
  if (run_operator)
    tidal::Logger::Get().Log("warn", "built without gRPC: tidal local runs no operator", {});
#endif
  std::printf("export KUBECONFIG=%s\n", (*cluster)->kubeconfig_path().c_str());
  std::fflush(stdout);
  while (!g_stop) pause();
  tidal::Logger::Get().Log("info", "tidal local is stopping", {});
#ifdef TIDAL_WITH_OPERATOR
  if (manager) manager->Stop();
#endif
  (*cluster)->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** raw_argv) {
  // One malloc arena, as `tidal operator` has (operator/main.cc says why): the operator runs in
  // this process too.
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
  std::vector<std::string> args =
      tidal::SplitFlagValues(argc, raw_argv, {"--no-operator", "--keep-logs"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return RunLocal(static_cast<int>(args.size()) - 1, argv.data() + 1);
}
