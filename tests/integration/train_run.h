// tests/integration/train_run.h — one tidal-train run as the integration tests read it: the
// process's result, rank 0's step lines from stdout by step, and the JSON log lines of stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"

namespace tidal::testing {

struct TrainRun {
  ProcessResult result;
  std::map<int64_t, nlohmann::json> steps;  // step → rank 0's line
  std::vector<nlohmann::json> logs;         // stderr's JSON lines
};

inline TrainRun RunTrain(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(300)) {
  TrainRun run;
  run.result = RunProcess(argv, timeout);
  for (const std::string* text : {&run.result.out, &run.result.err}) {
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      if (text == &run.result.out && j.contains("step"))
        run.steps[j["step"].get<int64_t>()] = j;
      else if (text == &run.result.err)
        run.logs.push_back(j);
    }
  }
  return run;
}

}  // namespace tidal::testing
