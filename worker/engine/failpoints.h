// worker/engine/failpoints.h — the test hooks the worker's binaries honour (tidal-worker,
// tidal-train): each one an environment variable, all of them listed here and read through
// Failpoints, nowhere else. A TIDAL_TEST_ variable that names none of them is refused at start:
// a misspelt hook would otherwise test nothing, and the test around it pass.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tidal::engine {

struct FailpointInfo {
  const char* name;   // the environment variable
  const char* takes;  // what its value must be
  const char* does;
};

inline constexpr FailpointInfo kFailpoints[] = {
    {"TIDAL_TEST_OOM_AT_STEP", "a step, >= 1",
     "the memory meter fails one allocation of that step's first micro-batch as an out-of-memory "
     "(once per process)"},
    {"TIDAL_TEST_LOSS_HOOK", "rise:STEP:FACTOR or noise:AMPLITUDE (worker/control/loss_hook.h)",
     "the loss the worker reports (logs, status, metrics) is altered; the loss it trains on is "
     "not"},
    {"TIDAL_TEST_STALL_AT_STEP", "a step, >= 1",
     "rank 0 of generation 1 stops training at that step for good, still answering its control "
     "API"},
    {"TIDAL_TEST_BARRIER_HOLD", "until-request",
     "every barrier holds its ranks paused until the next control request arrives"},
};

class Failpoints {
 public:
  // The failpoints set in `environment` (every TIDAL_TEST_ variable in it, which must each be
  // one of kFailpoints: InvalidArgument naming it otherwise). Empty values count as unset.
  static StatusOr<Failpoints> From(const std::map<std::string, std::string>& environment);
  // The same of this process's environment.
  static StatusOr<Failpoints> FromProcess();

  // The value of failpoint `name` (one of kFailpoints), "" when unset.
  std::string Get(std::string_view name) const;

 private:
  std::map<std::string, std::string, std::less<>> set_;
};

}  // namespace tidal::engine
