// tests/integration/reference_run.h — the losses of an uninterrupted `tidal-train` run, the
// curve that rescales, kills, drains and failovers are held to, made once per build and spec.
//
// Tests of one spec and length compare with the same curve, and each used to train it again
// (a 150-step reference of the e2e tests cost 19 s of two cores, three times a run). The run
// is kept in the test cache (run_cache.h) under a key of the spec's text — its metadata line
// aside, the job's name changes no loss — the ranks, the steps and tidal-train's identity.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/integration/run_cache.h"

namespace tidal::testing {

// step → loss of `tidal-train --config <manifest> --nproc <nproc> --max-steps <steps>`; empty,
// with `error` set, when the run failed.
inline std::map<int64_t, double> ReferenceRunLosses(const std::string& cache_dir,
                                                    const std::string& train_bin,
                                                    const std::string& manifest, int nproc,
                                                    int steps, std::string* error) {
  std::ifstream file(manifest);
  std::string key;
  for (std::string line; std::getline(file, line);)
    if (line.rfind("metadata:", 0) != 0) key += line + "\n";
  key += "nproc " + std::to_string(nproc) + " steps " + std::to_string(steps);
  const std::string dir = CachedRun(
      cache_dir, "reference-run", WithFileIdentity(key, train_bin), [&](const std::string& into) {
        ProcessResult r = RunProcess({train_bin, "--config", manifest, "--nproc",
                                      std::to_string(nproc), "--max-steps", std::to_string(steps)},
                                     std::chrono::seconds(300));
        *error = r.err;
        std::ofstream(into + "/stdout") << r.out;
        return r.exit_code == 0;
      });
  std::map<int64_t, double> losses;
  if (dir.empty()) return losses;
  std::ifstream in(dir + "/stdout");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j.contains("loss"))
      losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return losses;
}

}  // namespace tidal::testing
