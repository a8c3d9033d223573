// tests/integration/metrics_scrape.h — reading a real /metrics endpoint in tests: one scrape
// over HTTP (the project's client), `promtool check metrics` (Debian's prometheus) on what came
// back, and a sample's value by name and label.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "common/http/client.h"
#include "common/status.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {

inline StatusOr<std::string> ScrapeMetrics(const std::string& host, int port) {
  http::ClientOptions options;
  options.origin = {"http", host, port};
  options.connect_timeout = std::chrono::seconds(5);
  options.request_timeout = std::chrono::seconds(10);
  TIDAL_ASSIGN_OR_RETURN(auto client, http::Client::Create(options));
  http::Request request;
  request.method = "GET";
  request.target = "/metrics";
  TIDAL_ASSIGN_OR_RETURN(http::Response response, client->Send(request));
  if (response.status != 200)
    return Unavailable("GET /metrics: HTTP " + std::to_string(response.status));
  return response.body;
}

// promtool's complaints ("" when it has none), exit status included.
inline std::string PromtoolCheckMetrics(const std::string& exposition) {
  static int counter = 0;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("tidal-metrics-" + std::to_string(::getpid()) + "-" + std::to_string(++counter) + ".prom");
  std::ofstream(file) << exposition;
  ProcessResult r = RunProcess(
      {"/bin/sh", "-c", std::string(PROMTOOL_BIN) + " check metrics < \"$0\"", file.string()},
      std::chrono::seconds(30));
  std::filesystem::remove(file);
  if (r.exit_code == 0 && r.out.empty() && r.err.empty()) return "";
  return "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
}

// The value of the first sample of `name` whose label set contains `label` (e.g.
// R"(trainingjob="a")"; "" matches any).
inline std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                         const std::string& label = "") {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;  // a longer name that starts the same
    const auto close = line.rfind('}');
    const std::string labels = next == '{' ? line.substr(name.size(), close - name.size()) : "";
    if (!label.empty() && labels.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

}  // namespace tidal::testing
