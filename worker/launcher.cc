// worker/launcher.cc
#include "worker/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "common/log.h"

namespace tidal {
namespace {

std::atomic<int> g_forward_signal{0};
void OnSignal(int sig) { g_forward_signal = sig; }

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped (status " + std::to_string(status) + ")";
}

}  // namespace

Status RunLocalRanks(const LocalLaunch& launch) {
  struct sigaction action {
  }, previous_int{}, previous_term{};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);

  std::map<pid_t, int> rank_of;
  for (int rank = 0; rank < launch.nproc; ++rank) {
    std::vector<std::string> args = {launch.executable};
    args.insert(args.end(), launch.args.begin(), launch.args.end());
    for (const std::string& a :
         {std::string("--rank"), std::to_string(rank), std::string("--world-size"),
          std::to_string(launch.nproc), std::string("--store"),
          launch.store_host + ":" + std::to_string(launch.store_port)})
      args.push_back(a);
    // Built before fork: the child of a multi-threaded parent may only exec.
    const pid_t launcher = getpid();
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      for (auto& [p, r] : rank_of) kill(p, SIGKILL);
      return Unavailable(std::string("fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // A rank must not outlive its launcher.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);  // the launcher died before prctl took effect
      execv(launch.executable.c_str(), argv.data());
      _exit(127);
    }
    rank_of[pid] = rank;
  }
  LogInfo("ranks started", {{"nproc", launch.nproc}, {"store_port", launch.store_port}});

  Status failure;
  std::chrono::steady_clock::time_point kill_at{};
  while (!rank_of.empty()) {
    if (int sig = g_forward_signal.exchange(0); sig != 0) {
      for (auto& [pid, rank] : rank_of) kill(pid, sig);
      if (failure.ok()) failure = Unavailable(std::string("interrupted by ") + strsignal(sig));
      if (kill_at == std::chrono::steady_clock::time_point{})
        kill_at = std::chrono::steady_clock::now() + launch.grace;
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int rank = rank_of[pid];
      rank_of.erase(pid);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failure.ok()) {
        failure = Unavailable("rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                              ") " + DescribeExit(status));
        LogError("rank failed; stopping the others",
                 {{"failed_rank", rank}, {"cause", DescribeExit(status)}});
        for (auto& [other, r] : rank_of) kill(other, SIGTERM);
        kill_at = std::chrono::steady_clock::now() + launch.grace;
      }
      continue;
    }
    if (kill_at != std::chrono::steady_clock::time_point{} &&
        std::chrono::steady_clock::now() >= kill_at) {
      for (auto& [other, r] : rank_of) kill(other, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  return failure;
}

}  // namespace tidal
