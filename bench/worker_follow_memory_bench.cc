// bench/worker_follow_memory_bench.cc — what following one worker costs the operator: the
// resident memory of N worker pods each followed as the controller follows them (a
// contract::WorkerClient and its WatchStatus stream, through controller::StatusFeed), per pod.
// The workers are served by one bench/idle_worker_hub process (a status a second, pushed), so
// only the operator's side is in this process. Measured twice in the same run: first with
// gRPC's default transport settings (the baseline), then with Tidal's (ClientOptions::
// lean_transport); prints anonymous-memory bytes per followed pod for each and their ratio, one
// JSON line. Usage: worker_follow_memory_bench [--pods N] [--hub PATH]
#include <malloc.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "contract/client.h"
#include "operator/controller/status_feed.h"

namespace {

namespace controller = tidal::controller;
namespace contract = tidal::contract;
using Clock = std::chrono::steady_clock;

long StatusKib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::stol(line.substr(n + 1));
  return -1;
}

// Asks the hub to serve `address`; the returned connection keeps it served.
int Serve(const std::string& socket_path, const std::string& address, const std::string& token) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const std::string request = "LISTEN " + address + " " + token + "\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size()))
    return -1;
  char reply[256] = {};
  const ssize_t got = ::read(fd, reply, sizeof reply - 1);
  if (got < 3 || std::strncmp(reply, "OK\n", 3) != 0) {
    std::fprintf(stderr, "hub refused %s: %s\n", address.c_str(), reply);
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Measurement {
  double bytes_per_pod = 0;
  long threads = 0;
  double seconds_to_follow_all = 0;
};

// Follows every address (jobs of 10 pods) until each has pushed a status, lets them push for a
// few seconds more, and measures; then lets them all go.
Measurement Follow(const std::vector<std::string>& addresses, const std::string& token, bool lean) {
  malloc_trim(0);
  const long before = StatusKib("RssAnon");
  Measurement m;
  {
    controller::StatusFeed feed(controller::StatusFeed::Options{}, [](const std::string&) {});
    std::map<std::string, std::map<std::string, std::shared_ptr<contract::WorkerApi>>> jobs;
    std::map<std::string, std::vector<std::string>> pods;
    for (size_t i = 0; i < addresses.size(); ++i) {
      contract::ClientOptions o;
      o.address = addresses[i];
      o.token = token;
      o.lean_transport = lean;
      const std::string job = "job-" + std::to_string(i / 10);
      const std::string pod = job + "-worker-" + std::to_string(i % 10);
      jobs[job][pod] = std::make_shared<contract::WorkerClient>(o);
      pods[job].push_back(pod);
    }
    const auto t0 = Clock::now();
    for (const auto& [job, clients] : jobs) feed.Follow(job, clients);
    const auto deadline = t0 + std::chrono::seconds(120);
    for (;;) {
      size_t pushed = 0;
      for (const auto& [job, names] : pods) pushed += feed.Pushed(job, names) ? 1 : 0;
      if (pushed == pods.size()) break;
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "only %zu of %zu jobs pushed within 120 s\n", pushed, pods.size());
        std::exit(1);
      }
      for (const auto& [job, clients] : jobs) feed.Follow(job, clients);  // reopens what ended
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    m.seconds_to_follow_all = std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::seconds(3));  // a few pushes each
    const long after = StatusKib("RssAnon");
    m.threads = StatusKib("Threads");
    m.bytes_per_pod = static_cast<double>(after - before) * 1024.0 / addresses.size();
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int pods = 1000;
  std::string hub;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--pods") {
      pods = std::atoi(argv[i + 1]);
    } else if (flag == "--hub") {
      hub = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: worker_follow_memory_bench [--pods N] [--hub PATH]\n");
      return 2;
    }
  }
  if (pods <= 0 || pods > 60000) {
    std::fprintf(stderr, "--pods: expected 1..60000, got %d\n", pods);
    return 2;
  }
  if (hub.empty()) {
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    hub = self.substr(0, self.rfind('/') + 1) + "idle_worker_hub";
  }
  char dir_template[] = "/tmp/tidal-follow-bench-XXXXXX";
  if (!::mkdtemp(dir_template)) return 1;
  const std::string socket_path = std::string(dir_template) + "/hub.sock";
  const pid_t hub_pid = ::fork();
  if (hub_pid == 0) {
    ::execl(hub.c_str(), hub.c_str(), "--socket", socket_path.c_str(), nullptr);
    std::perror(hub.c_str());
    ::_exit(127);
  }
  int code = 1;
  for (int i = 0; i < 100 && ::access(socket_path.c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<int> served;
  std::vector<std::string> addresses;
  const std::string token = "bench-token";
  for (int i = 0; i < pods; ++i) {  // 127.1.x.y:50051, as pods have addresses of their own
    const std::string address =
        "127.1." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":50051";
    const int fd = Serve(socket_path, address, token);
    if (fd < 0) break;
    served.push_back(fd);
    addresses.push_back(address);
  }
  if (static_cast<int>(addresses.size()) == pods) {
    const Measurement base = Follow(addresses, token, /*lean=*/false);
    const Measurement lean = Follow(addresses, token, /*lean=*/true);
    std::printf(
        "{\"pods\":%d,\"grpc_defaults_bytes_per_pod\":%.0f,\"tidal_bytes_per_pod\":%.0f,"
        "\"ratio\":%.3f,\"threads\":%ld,\"seconds_to_follow_all\":{\"grpc_defaults\":%.2f,"
        "\"tidal\":%.2f}}\n",
        pods, base.bytes_per_pod, lean.bytes_per_pod,
        base.bytes_per_pod > 0 ? lean.bytes_per_pod / base.bytes_per_pod : 0.0, lean.threads,
        base.seconds_to_follow_all, lean.seconds_to_follow_all);
    code = 0;
  }
  for (int fd : served) ::close(fd);
  ::kill(hub_pid, SIGTERM);
  ::waitpid(hub_pid, nullptr, 0);
  std::filesystem::remove_all(dir_template);
  return code;
}
