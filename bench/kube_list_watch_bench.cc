// bench/kube_list_watch_bench.cc — list and watch throughput of N objects (default 10,000
// ConfigMaps of ~1 KiB, the size of a small Pod) through a real `tidal local` over HTTPS, with
// the operator's own client and watcher. Baselines from the same run:
//   list / parse    — a full LIST against json::parse of the same bytes in this process (what
//                     the server and the wire add on top of the client's unavoidable decoding);
//   watch / write   — the watcher's event delivery rate against the rate the writers achieve
//                     (>= 1: the watch keeps up with writes).
// Prints one JSON line. Usage: kube_list_watch_bench [--objects N] [--writers T]
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "kube/config.h"
#include "kube/watcher.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"

using namespace tidal;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

json ConfigMap(int i) {
  json data = json::object();
  for (int k = 0; k < 8; ++k)
    data["key-" + std::to_string(k)] = std::string(96, static_cast<char>('a' + (i + k) % 26));
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", "bench-" + std::to_string(i)},
            {"labels", {{"app", "bench"}, {"shard", std::to_string(i % 16)}}}}},
          {"data", data}};
}

// Creates objects [from, to) with `writers` threads, each with its own connection.
bool CreateAll(const kube::Connection& connection, int from, int to, int writers) {
  std::atomic<int> next{from};
  std::atomic<bool> ok{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < writers; ++t)
    threads.emplace_back([&] {
      auto client = kube::KubeClient::Create(connection);
      if (!client.ok()) return ok.store(false);
      for (int i = next++; i < to; i = next++) {
        auto created = (*client)->Call(
            *kube::CreateRequest(kube::Resource::ConfigMaps(), "default", ConfigMap(i)));
        if (!created.ok()) {
          std::fprintf(stderr, "create %d: %s\n", i, created.status().message().c_str());
          return ok.store(false);
        }
      }
    });
  for (auto& t : threads) t.join();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int objects = 10000, writers = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--objects")
      objects = std::atoi(argv[i + 1]);
    else if (flag == "--writers")
      writers = std::atoi(argv[i + 1]);
    else
      return std::fprintf(stderr, "usage: %s [--objects N] [--writers T]\n", argv[0]), 2;
  }
  auto dir = std::filesystem::temp_directory_path() / ("tidal-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  int status = 1;
  {
    testing::Process server({TIDAL_BIN, "local", "--data", (dir / "data").string(), "--history",
                             std::to_string(4 * objects)});
    if (!server.WaitForOutput(
            [](const std::string& out) {
              return out.find("export KUBECONFIG") != std::string::npos;
            },
            std::chrono::seconds(30)))
      return std::fprintf(stderr, "tidal local did not start\n"), 1;
    auto connection = kube::LoadKubeconfig((dir / "data/kubeconfig").string());
    auto client = kube::KubeClient::Create(*connection);
    if (!connection.ok() || !client.ok()) return 1;

    auto t0 = Clock::now();
    if (!CreateAll(*connection, 0, objects, writers)) return 1;
    double create_s = Seconds(t0, Clock::now());

    // One LIST of everything, then the same bytes parsed in-process (the baseline).
    kube::ListOptions all;
    auto t1 = Clock::now();
    auto listed = (*client)->Call(*kube::ListRequest(kube::Resource::ConfigMaps(), "default", all));
    double list_s = Seconds(t1, Clock::now());
    if (!listed.ok() || (*listed)["items"].size() != static_cast<size_t>(objects)) return 1;
    std::string bytes = listed->dump();
    auto t2 = Clock::now();
    json reparsed = json::parse(bytes);
    double parse_s = Seconds(t2, Clock::now());

    // Paginated, as informers with a limit do.
    kube::ListOptions page;
    page.limit = 500;
    auto t3 = Clock::now();
    size_t paged = 0;
    while (true) {
      auto part =
          (*client)->Call(*kube::ListRequest(kube::Resource::ConfigMaps(), "default", page));
      if (!part.ok()) return 1;
      paged += (*part)["items"].size();
      page.continue_token = (*part)["metadata"].value("continue", "");
      if (page.continue_token.empty()) break;
    }
    double paged_s = Seconds(t3, Clock::now());

    // The watcher: its initial list, then N more objects written while it watches.
    std::atomic<int> delivered{0};
    kube::WatcherOptions options;
    options.resource = kube::Resource::ConfigMaps();
    options.namespace_ = "default";
    auto t4 = Clock::now();
    Clock::time_point synced{}, caught_up{};
    kube::Watcher watcher(**client, options, [&](const kube::ObjectEvent&) {
      int n = ++delivered;
      if (n == objects) synced = Clock::now();
      if (n == 2 * objects) caught_up = Clock::now();
    });
    while (delivered < objects && Seconds(t4, Clock::now()) < 300)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    double watcher_list_s = Seconds(t4, synced);
    auto t5 = Clock::now();
    if (!CreateAll(*connection, objects, 2 * objects, writers)) return 1;
    double write_s = Seconds(t5, Clock::now());
    while (delivered < 2 * objects && Seconds(t5, Clock::now()) < 300)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    watcher.Stop();
    double watch_s = Seconds(t5, caught_up);
    if (delivered < 2 * objects) return std::fprintf(stderr, "watch fell short\n"), 1;

    json out = {{"bench", "kube_list_watch"},
                {"objects", objects},
                {"writers", writers},
                {"list_bytes", bytes.size()},
                {"create_objects_per_s", objects / create_s},
                {"list_objects_per_s", objects / list_s},
                {"list_paged500_objects_per_s", paged / paged_s},
                {"watcher_initial_list_objects_per_s", objects / watcher_list_s},
                {"watch_events_per_s", objects / watch_s},
                {"ratio_list_vs_parse", list_s / parse_s},
                {"ratio_watch_vs_write", write_s / watch_s}};
    std::printf("%s\n", out.dump().c_str());
    status = reparsed.is_object() ? 0 : 1;
  }
  std::filesystem::remove_all(dir);
  return status;
}
