// worker/launcher.h — runs N local ranks as child processes (like `torchrun --standalone`) and
// watches them: when one fails, the others are stopped within a bounded time and the error
// names the rank. Plain POSIX; no LibTorch.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace tidal {

struct LocalLaunch {
  std::string executable;
  std::vector<std::string> args;  // each rank gets these + --rank R --world-size N --store H:P
  int nproc = 1;
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  // After a rank fails, survivors get SIGTERM, then SIGKILL after this long.
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
};

// Blocks until every rank exited. OK when all exited 0; otherwise the first failure, e.g.
// "rank 1 (pid 4242) was killed by signal 9 (Killed)".
Status RunLocalRanks(const LocalLaunch& launch);

}  // namespace tidal
