// tests/integration/process.h — runs a real child process with captured stdout/stderr and a
// bounded wait; the child is killed when the wait runs out or the object goes away.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tidal::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string out, err;
};

class Process {
 public:
  explicit Process(const std::vector<std::string>& argv);
  ~Process();
  pid_t pid() const { return pid_; }
  // Reads output until `done(stdout_so_far)` (with `from_stderr`, the stderr so far) holds or
  // the timeout passes; false on timeout.
  bool WaitForOutput(const std::function<bool(const std::string&)>& done,
                     std::chrono::milliseconds timeout, bool from_stderr = false);
  // Waits for exit; kills the child (SIGKILL) when it has not exited within the timeout.
  ProcessResult Wait(std::chrono::milliseconds timeout);

 private:
  void Pump(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
};

ProcessResult RunProcess(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

// Direct children of `pid` (from /proc), with their command lines.
std::vector<std::pair<pid_t, std::string>> ChildProcesses(pid_t pid);

}  // namespace tidal::testing
