// common/http/server.h — a small HTTP/1.1 server (plain or TLS) for loopback services:
// `tidal local`'s API server now, /metrics later. One thread per connection, keep-alive,
// request bodies up to a limit, and streamed (chunked) responses for watches and log follows.
// It knows nothing of Kubernetes: protocol errors (oversize body, malformed head) go through
// ErrorResponder so the caller can answer in its own format.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/http/connection.h"
#include "common/http/message.h"
#include "common/status.h"

namespace tidal::http {

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // A complete response (Content-Length is set here).
  virtual Status Send(Response response) = 0;
  // Starts a chunked response; then WriteChunk any number of times. The stream ends when the
  // handler returns.
  virtual Status StartStream(int status, Headers headers) = 0;
  virtual Status WriteChunk(std::string_view data) = 0;
  // Whether the client went away (poll this while waiting for something to stream).
  virtual bool ClientGone() = 0;
  // Whether the server is stopping (streams should end).
  virtual bool Stopping() const = 0;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;
using ErrorResponder = std::function<Response(int status, const std::string& message)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                     // 0: any free port; port() tells which
  std::shared_ptr<TlsContext> tls;  // null: plain HTTP
  size_t max_body_bytes = 3 * 1024 * 1024;
  size_t max_head_bytes = 1024 * 1024;
  std::chrono::milliseconds io_timeout{std::chrono::seconds(60)};
  ErrorResponder on_error;  // null: plain-text errors
};

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // Stops accepting, wakes every connection (streams see Stopping()), joins all threads.
  void Stop();

 private:
  Server(ServerOptions options, Handler handler, int listen_fd, int port);
  void AcceptLoop();
  void Serve(std::unique_ptr<Connection> connection);

  ServerOptions options_;
  Handler handler_;
  int listen_fd_;
  int port_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::list<Connection*> live_;  // guarded by mu_, for Stop() to shut them down
  int active_ = 0;               // detached connection threads still running, guarded by mu_
};

}  // namespace tidal::http
