// bench/idle_worker.cc — a sleeping stand-in for tidal-worker, for the operator-at-scale
// benchmark (bench/operator_scale.sh). It takes tidal-worker's arguments, asks the bench's
// hub (bench/idle_worker_hub.cc, at $TIDAL_IDLE_HUB) to serve the control API on --listen
// with the job's token, and sleeps in a read of that connection: no threads, no timers. It
// exits 0 when the hub says the worker was shut down, and 1 when the hub goes away. Killed
// (the pod deleted), its connection closes and the hub stops serving its address.
// Never a worker: bench use only.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  std::string listen, token_file;
  for (int i = 1; i + 1 < argc; ++i) {  // tidal-worker's arguments; the rest are ignored
    const std::string flag = argv[i];
    if (flag == "--listen")
      listen = argv[++i];
    else if (flag == "--token-file")
      token_file = argv[++i];
  }
  std::ifstream in(token_file);
  std::stringstream token;
  token << in.rdbuf();
  std::string t = token.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const char* hub = std::getenv("TIDAL_IDLE_HUB");
  if (listen.empty() || t.empty() || !hub || !*hub) {
    std::fprintf(stderr,
                 "idle_worker: --listen, a non-empty --token-file and TIDAL_IDLE_HUB (the hub's "
                 "socket) are required\n");
    return 2;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (std::strlen(hub) >= sizeof(addr.sun_path)) {
    std::fprintf(stderr, "idle_worker: TIDAL_IDLE_HUB: path too long\n");
    return 2;
  }
  std::strcpy(addr.sun_path, hub);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::fprintf(stderr, "idle_worker: hub %s: %s\n", hub, std::strerror(errno));
    return 1;
  }
  const std::string request = "LISTEN " + listen + " " + t + "\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    std::fprintf(stderr, "idle_worker: hub %s: %s\n", hub, std::strerror(errno));
    return 1;
  }
  std::string line;
  char c;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "idle_worker: the hub closed the connection\n");
      return 1;
    }
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line == "OK") {
      std::printf("{\"msg\":\"serving the control API through the hub\",\"listen\":\"%s\"}\n",
                  listen.c_str());
      std::fflush(stdout);
    } else if (line == "EXIT") {
      return 0;
    } else {
      std::fprintf(stderr, "idle_worker: hub: %s\n", line.c_str());
      return 1;
    }
    line.clear();
  }
}
