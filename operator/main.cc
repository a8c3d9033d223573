// operator/main.cc — the `tidal` command. Subcommands:
//   tidal local [FLAGS]
//       the local cluster with the operator: runs tidal-local (local/main.cc) in its place
//   tidal operator [--kubeconfig PATH] [--namespace NS] [--default-checkpoint-root URI]
//                  [--no-leader-elect] [--lease-namespace NS] [--install-crd]
//                  [--metrics-address ADDR] [--leader-elect-lease-duration D]
//                  [--leader-elect-renew-deadline D] [--leader-elect-retry-period D]
//       the operator against any cluster (in a pod: the in-cluster config)
#include <malloc.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/log.h"
#ifdef TIDAL_WITH_OPERATOR  // gRPC found: the operator is built (a GPU host may lack it)
#include "operator/controller/manager.h"
#endif

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// The usage on stderr, exit status 2 (a bad invocation), or with `help` on stdout, status 0.
int Usage(const char* why, bool help = false) {
  if (why) std::fprintf(stderr, "tidal: %s\n", why);
  std::fprintf(help ? stdout : stderr,
               "usage: tidal local [FLAGS]  the local cluster with the operator (tidal-local,\n"
               "                            beside this binary; tidal local --help: its flags)\n"
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
               "                     (default 2s); durations as 500ms, 4s, 1m\n"
               "  --worker-unreachable-timeout D  a running worker that does not answer the\n"
               "                     operator for this long counts as failed and is replaced\n"
               "                     (default 30s; whole seconds, as 10s or 2m)\n"
               "  --yield-to-priority N  jobs shrink above their minimum for a Pending GPU pod\n"
               "                     of another workload whose priority is at least N and at\n"
               "                     least theirs (default: any pod of a higher priority)\n");
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

// `tidal local`: the local cluster is a program of its own (local/, as kind and envtest are
// beside an operator), found beside this one and run in this process's place (the same pid, so
// a signal to `tidal local` reaches it). `argv`: this process's, argv[1] being "local".
int RunLocal(char** argv) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) self = argv[0];
  const std::string local = (self.parent_path() / "tidal-local").string();
  argv[1] = const_cast<char*>(local.c_str());
  ::execv(local.c_str(), argv + 1);
  std::fprintf(stderr,
               "tidal local: cannot run %s (%s): build it with `make build` or the target "
               "tidal-local\n",
               local.c_str(), std::strerror(errno));
  return 1;
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
    } else if (flag == "--worker-unreachable-timeout") {
      std::chrono::milliseconds d{};
      if (!ParseDuration(value, d) || d.count() % 1000 != 0)
        return Usage((flag +
                      ": expected a positive whole number of seconds such as 30s or 2m, got \"" +
                      value + "\"")
                         .c_str());
      m.controller.reconcile.unreachable_after =
          std::chrono::duration_cast<std::chrono::seconds>(d);
    } else if (flag == "--yield-to-priority") {
      const std::string text = value;
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE || n < -2'000'000'000 ||
          n > 2'000'000'000)
        return Usage((flag +
                      ": expected a priority, an integer in [-2000000000, 2000000000], got \"" +
                      text + "\"")
                         .c_str());
      m.controller.yield_to_priority = n;
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
  // `tidal local ...` is tidal-local's to read, flags and all.
  if (argc >= 2 && std::string(raw_argv[1]) == "local") return RunLocal(raw_argv);
  std::vector<std::string> args =
      tidal::SplitFlagValues(argc, raw_argv, {"--no-leader-elect", "--install-crd"});
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  argc = static_cast<int>(args.size());
  char** argv = pointers.data();
  if (argc < 2) return Usage(nullptr);
  std::string command = argv[1];
  if (command == "operator") return RunOperator(argc - 2, argv + 2);
  if (IsHelp(command) || command == "help") return Usage(nullptr, /*help=*/true);
  return Usage(("unknown command " + command).c_str());
}
