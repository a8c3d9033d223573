// operator/main.cc — the `tidal` command. Subcommands:
//   tidal local [--data DIR] [--port P] [--nodes K] [--gpus N] [--image I=EXE] [--no-operator]
//               [--keep-logs]
//               [--operator-metrics-address ADDR] [--audit-log PATH]
//       the local cluster, running the operator (and installing the CRD) unless --no-operator
//   tidal operator [--kubeconfig PATH] [--namespace NS] [--default-checkpoint-root URI]
//                  [--no-leader-elect] [--lease-namespace NS] [--install-crd]
//                  [--metrics-address ADDR] [--leader-elect-lease-duration D]
//                  [--leader-elect-renew-deadline D] [--leader-elect-retry-period D]
//       the operator against any cluster (in a pod: the in-cluster config)
#include <malloc.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <filesystem>

#include "common/log.h"
#ifdef TIDAL_WITH_OPERATOR  // gRPC found: the operator is built (a GPU host may lack it)
#include "operator/controller/manager.h"
#endif
#include "operator/local/cluster.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// The usage on stderr, exit status 2 (a bad invocation), or with `help` on stdout, status 0.
int Usage(const char* why, bool help = false) {
  if (why) std::fprintf(stderr, "tidal: %s\n", why);
  std::fprintf(help ? stdout : stderr,
               "usage: tidal local [--data DIR] [--port P] [--nodes K] [--gpus N]\n"
               "                   [--image IMAGE=EXECUTABLE]...\n"
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
               "       tidal operator [--kubeconfig PATH] [--namespace NS] [--no-leader-elect]\n"
               "                      [--default-checkpoint-root URI] [--install-crd]\n"
               "                      [--lease-namespace NS] [--metrics-address HOST:PORT]\n"
               "  --kubeconfig PATH  default: $KUBECONFIG, ~/.kube/config, else in-cluster\n"
               "  --namespace NS     watch one namespace (default: all)\n"
               "  --lease-namespace NS  where the leader-election Lease lives (default:\n"
               "                     $POD_NAMESPACE, else default)\n"
               "  --default-checkpoint-root URI  checkpoints of jobs whose spec names no store\n"
               "                     go to URI/<namespace>/<job>/<job uid>\n"
               "  --metrics-address HOST:PORT  where /metrics is served (default :8080; \"\"\n"
               "                     serves none)\n"
               "  --leader-elect-lease-duration D  how long a standby waits after the leader's\n"
               "                     last renewal before it takes over (default 15s)\n"
               "  --leader-elect-renew-deadline D  how long the leader retries a renewal before\n"
               "                     it stops leading (default 10s)\n"
               "  --leader-elect-retry-period D  between tries to take or renew the lease\n"
               "                     (default 2s); durations as 500ms, 4s, 1m\n");
  return help ? 0 : 2;
}

bool IsHelp(const std::string& flag) { return flag == "--help" || flag == "-h"; }

// A duration as Go's flag package writes the common ones: a whole number and ms, s or m.
bool ParseDuration(const std::string& text, std::chrono::milliseconds& out) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 9) return false;
  const long long n = std::stoll(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  if (unit == "ms") {
    out = std::chrono::milliseconds(n);
  } else if (unit == "s") {
    out = std::chrono::seconds(n);
  } else if (unit == "m") {
    out = std::chrono::minutes(n);
  } else {
    return false;
  }
  return n > 0;
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
  bool run_operator = true;
  std::string metrics_address = "127.0.0.1:0";
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

int RunOperator(int argc, char** argv) {
#ifndef TIDAL_WITH_OPERATOR
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "tidal operator: this build has no gRPC, so no operator\n");
  return 1;
#else
  tidal::controller::ManagerOptions m;
  m.metrics_address = ":8080";
  // In a pod, the Lease lives in the pod's own namespace (the downward API's metadata.namespace
  // as POD_NAMESPACE): a kustomize overlay that moves the Deployment moves the Lease with it.
  if (const char* ns = std::getenv("POD_NAMESPACE"); ns && *ns) m.lease_namespace = ns;
  std::string kubeconfig;
  for (int i = 0; i < argc; ++i) {
    std::string flag = argv[i];
    if (IsHelp(flag)) return Usage(nullptr, /*help=*/true);
    if (flag == "--no-leader-elect") {
      m.leader_elect = false;
      continue;
    }
    if (flag == "--install-crd") {
      m.install_crd = true;
      continue;
    }
    if (i + 1 >= argc) return Usage(("missing value for " + flag).c_str());
    const char* value = argv[++i];
    if (flag == "--kubeconfig") {
      kubeconfig = value;
    } else if (flag == "--namespace") {
      m.controller.namespace_ = value;
    } else if (flag == "--default-checkpoint-root") {
      m.controller.default_checkpoint_root = value;
    } else if (flag == "--lease-namespace") {
      m.lease_namespace = value;
    } else if (flag == "--metrics-address") {
      m.metrics_address = value;
    } else if (flag == "--leader-elect-lease-duration" || flag == "--leader-elect-renew-deadline" ||
               flag == "--leader-elect-retry-period") {
      std::chrono::milliseconds d{};
      if (!ParseDuration(value, d))
        return Usage(
            (flag + ": expected a positive duration such as 500ms, 4s or 1m, got \"" + value + "\"")
                .c_str());
      (flag == "--leader-elect-lease-duration"   ? m.lease_duration
       : flag == "--leader-elect-renew-deadline" ? m.renew_deadline
                                                 : m.retry_period) = d;
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  // client-go's rule: the lease outlasts the renew deadline, which outlasts a jittered retry.
  if (m.lease_duration <= m.renew_deadline || static_cast<double>(m.renew_deadline.count()) <=
                                                  tidal::kube::LeaderElectionConfig::kJitterFactor *
                                                      static_cast<double>(m.retry_period.count()))
    return Usage(("--leader-elect-lease-duration (" + std::to_string(m.lease_duration.count()) +
                  "ms) must exceed --leader-elect-renew-deadline (" +
                  std::to_string(m.renew_deadline.count()) +
                  "ms), which must exceed 1.2 x --leader-elect-retry-period (" +
                  std::to_string(m.retry_period.count()) + "ms)")
                     .c_str());
  auto connection = kubeconfig.empty() ? tidal::kube::DefaultConnection()
                                       : tidal::kube::LoadKubeconfig(kubeconfig);
  if (!connection.ok()) {
    std::fprintf(stderr, "tidal operator: %s\n", connection.status().message().c_str());
    return 2;
  }
  m.connection = *connection;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto manager = tidal::controller::Manager::Start(std::move(m));
  if (!manager.ok()) {
    std::fprintf(stderr, "tidal operator: %s\n", manager.status().message().c_str());
    return 1;
  }
  while (!g_stop) pause();
  (*manager)->Stop();
  return 0;
#endif
}

}  // namespace

int main(int argc, char** raw_argv) {
  // One malloc arena, not glibc's eight per core: the operator's threads (reconcile workers,
  // gRPC's, the pools) each held freed memory in an arena of their own, resident for nothing
  // (at 200 jobs, 2 arenas to 1 took 1.1 MiB off; the threads mostly wait on the network, so
  // one arena's lock costs little). MALLOC_ARENA_MAX in the environment still decides.
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
  // "--flag=value" is read as "--flag value", as Go's flag package (and so kubectl) reads it:
  // manifests and the Helm chart write it that way. A switch takes =true (on) or =false (off);
  // any other value stays attached, and the parser calls it an unknown flag.
  static const std::set<std::string> kSwitches = {"--no-operator", "--keep-logs",
                                                  "--no-leader-elect", "--install-crd"};
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = raw_argv[i];
    size_t eq = a.find('=');
    if (i == 0 || a.rfind("--", 0) != 0 || eq == std::string::npos) {
      args.push_back(a);
      continue;
    }
    std::string name = a.substr(0, eq), value = a.substr(eq + 1);
    if (!kSwitches.count(name)) {
      args.push_back(name);
      args.push_back(value);
    } else if (value == "true") {
      args.push_back(name);
    } else if (value != "false") {
      args.push_back(a);
    }
  }
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  argc = static_cast<int>(args.size());
  char** argv = pointers.data();
  if (argc < 2) return Usage(nullptr);
  std::string command = argv[1];
  if (command == "local") return RunLocal(argc - 2, argv + 2);
  if (command == "operator") return RunOperator(argc - 2, argv + 2);
  if (IsHelp(command) || command == "help") return Usage(nullptr, /*help=*/true);
  return Usage(("unknown command " + command).c_str());
}
