// tests/integration/process.cc
#include "tests/integration/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <fstream>
#include <sstream>

namespace tidal::testing {

Process::Process(const std::vector<std::string>& argv) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return;
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // Dies with the test: a test binary killed before its destructors ran (a crash, SIGPIPE)
    // must not leave servers behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

Process::~Process() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void Process::Pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (poll(fds, 2, timeout_ms) <= 0) return;
  char buf[65536];
  for (int i = 0; i < 2; ++i) {
    if (fds[i].revents & (POLLIN | POLLHUP)) {
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
    }
  }
}

bool Process::WaitForOutput(const std::function<bool(const std::string&)>& done,
                            std::chrono::milliseconds timeout, bool from_stderr) {
  const std::string& seen = from_stderr ? err_ : out_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done(seen)) return true;
    Pump(50);
    siginfo_t info{};
    // Exited (not reaped, so Wait() still gets the status): no more output will come.
    if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
      Pump(0);
      break;
    }
  }
  return done(seen);
}

ProcessResult Process::Wait(std::chrono::milliseconds timeout) {
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    Pump(20);
    pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = true;
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
  }
  // Drain what is left in the pipes.
  for (int i = 0; i < 100; ++i) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (poll(fds, 2, 0) <= 0) break;
    Pump(0);
  }
  pid_ = -1;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.out = out_;
  result.err = err_;
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  Process p(argv);
  return p.Wait(timeout);
}

std::vector<std::pair<pid_t, std::string>> ChildProcesses(pid_t pid) {
  std::vector<std::pair<pid_t, std::string>> children;
  std::ifstream list("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t child;
  while (list >> child) {
    std::ifstream cmd("/proc/" + std::to_string(child) + "/cmdline");
    std::stringstream text;
    text << cmd.rdbuf();
    std::string line = text.str();
    for (char& c : line)
      if (c == '\0') c = ' ';
    children.emplace_back(child, line);
  }
  return children;
}

}  // namespace tidal::testing
