// tests/integration/kube/lease_contender.cc — a leader-election candidate as its own process,
// for the integration test: runs a LeaderElector against the API server of a kubeconfig and
// prints one JSON line per callback on stdout:
//   {"event":"leading"|"stopped"|"new_leader","identity":ID,"leader":L,"t":UNIX_SECONDS}
// SIGTERM/SIGINT stop it cleanly (the lease is released) and it exits 0; losing the lease
// prints "stopped" and exits 1 at once, as controller-runtime's manager does.
//
//   lease_contender --kubeconfig PATH --identity ID --lease NAME [--namespace NS]
//                   [--lease-ms N] [--renew-ms N] [--retry-ms N]
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "kube/config.h"
#include "kube/leader.h"

namespace {

std::mutex print_mu;

void Print(const std::string& event, const std::string& identity, const std::string& leader = "") {
  nlohmann::json line = {
      {"event", event},
      {"identity", identity},
      {"t",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  if (!leader.empty()) line["leader"] = leader;
  std::lock_guard<std::mutex> lock(print_mu);
  std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "lease_contender: %s\nusage: lease_contender --kubeconfig PATH --identity ID "
               "--lease NAME [--namespace NS] [--lease-ms N] [--renew-ms N] [--retry-ms N]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kubeconfig;
  tidal::kube::LeaderElectionConfig config;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--kubeconfig") {
      kubeconfig = value;
    } else if (flag == "--identity") {
      config.identity = value;
    } else if (flag == "--lease") {
      config.lease_name = value;
    } else if (flag == "--namespace") {
      config.lease_namespace = value;
    } else if (flag == "--lease-ms") {
      config.lease_duration = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else if (flag == "--renew-ms") {
      config.renew_deadline = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else if (flag == "--retry-ms") {
      config.retry_period = std::chrono::milliseconds(std::atoll(value.c_str()));
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  if (kubeconfig.empty()) return Usage("--kubeconfig is required");

  // Block the stop signals in every thread; the main thread takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto connection = tidal::kube::LoadKubeconfig(kubeconfig);
  if (!connection.ok()) return Usage(connection.status().ToString().c_str());
  auto client = tidal::kube::KubeClient::Create(*connection);
  if (!client.ok()) return Usage(client.status().ToString().c_str());

  const std::string identity = config.identity;
  std::mutex mu;
  std::condition_variable cv;
  bool signalled = false;
  tidal::kube::LeaderCallbacks callbacks;
  callbacks.on_started_leading = [&] { Print("leading", identity); };
  callbacks.on_stopped_leading = [&] {
    Print("stopped", identity);
    std::lock_guard<std::mutex> lock(mu);
    if (!signalled) {
      // Lost, not asked to stop: leave now (a renew may still hang on the server).
      std::fflush(stdout);
      std::_Exit(1);
    }
  };
  callbacks.on_new_leader = [&](const std::string& leader) {
    Print("new_leader", identity, leader);
  };
  tidal::kube::LeaderElector elector(**client, config, callbacks);
  if (auto started = elector.Start(); !started.ok()) return Usage(started.ToString().c_str());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  {
    std::lock_guard<std::mutex> lock(mu);
    signalled = true;
  }
  elector.Stop();  // stops leading (prints "stopped") and releases the lease
  Print("exited", identity);
  return 0;
}
