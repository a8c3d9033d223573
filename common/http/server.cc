// common/http/server.cc
#include "common/http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tidal::http {
namespace {

class ConnectionWriter : public ResponseWriter {
 public:
  ConnectionWriter(Connection& connection, const std::atomic<bool>& stopping, bool head_only)
      : connection_(connection), stopping_(stopping), head_only_(head_only) {}

  Status Send(Response response) override {
    response.headers.Set("Content-Length", std::to_string(response.body.size()));
    started_ = true;
    std::string wire = SerializeResponseHead(response);
    if (!head_only_) wire += response.body;
    Status s = connection_.WriteAll(wire);
    if (!s.ok()) broken_ = true;
    return s;
  }
  Status StartStream(int status, Headers headers) override {
    Response head;
    head.status = status;
    head.headers = std::move(headers);
    head.headers.Set("Transfer-Encoding", "chunked");
    started_ = streaming_ = true;
    Status s = connection_.WriteAll(SerializeResponseHead(head));
    if (!s.ok()) broken_ = true;
    return s;
  }
  Status WriteChunk(std::string_view data) override {
    if (data.empty()) return OkStatus();  // an empty chunk would end the stream
    Status s = connection_.WriteAll(EncodeChunk(data));
    if (!s.ok()) broken_ = true;
    return s;
  }
  bool ClientGone() override { return broken_ || connection_.PeerClosed(); }
  bool Stopping() const override { return stopping_.load(); }

  // After the handler: end a stream; report whether the connection can serve another request.
  bool Finish() {
    if (broken_) return false;
    if (streaming_) {
      if (!connection_.WriteAll("0\r\n\r\n").ok()) return false;
    }
    return started_;
  }

 private:
  Connection& connection_;
  const std::atomic<bool>& stopping_;
  bool head_only_;
  bool started_ = false;
  bool streaming_ = false;
  bool broken_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Handler handler) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return InvalidArgument("host: expected an IPv4 address, got \"" + options.host + "\"");
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0) {
    std::string why = std::strerror(errno);
    close(fd);
    return Unavailable("listening on " + options.host + ":" + std::to_string(options.port) + ": " +
                       why);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  std::unique_ptr<Server> server(new Server(std::move(options), std::move(handler), fd, port));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

Server::Server(ServerOptions options, Handler handler, int listen_fd, int port)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      listen_fd_(listen_fd),
      port_(port) {}

Server::~Server() { Stop(); }

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  for (Connection* c : live_) c->Shutdown();
  idle_.wait(lock, [&] { return active_ == 0; });
}

void Server::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    int ready = poll(&p, 1, 200);
    if (ready <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    ++active_;
    std::thread([this, fd] {
      {
        auto connection = Connection::Accept(fd, options_.tls, options_.io_timeout);
        if (connection.ok()) Serve(std::move(*connection));
      }
      // OpenSSL's state of this thread (its error queue, with the strings of a failed
      // handshake or read) is freed when the thread ends, which for a detached thread may be
      // after Stop has returned and the process has gone on to exit: LeakSanitizer then saw
      // it as leaked (HttpTls tests, now and then). Freed here, before Stop can return.
      OPENSSL_thread_stop();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) idle_.notify_all();
    }).detach();
  }
}

void Server::Serve(std::unique_ptr<Connection> connection) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return;
    live_.push_back(connection.get());
  }
  auto error_response = [&](int status, const std::string& message) {
    if (options_.on_error) return options_.on_error(status, message);
    Response r;
    r.status = status;
    r.headers.Set("Content-Type", "text/plain");
    r.body = message + "\n";
    return r;
  };
  while (!stopping_.load()) {
    auto head = connection->ReadHead(options_.max_head_bytes);
    if (!head.ok()) {
      if (head.status().code() == StatusCode::kInvalidArgument) {
        Response r = error_response(431, head.status().message());
        r.headers.Set("Connection", "close");
        ConnectionWriter(*connection, stopping_, false).Send(std::move(r)).ok();
      }
      break;
    }
    Request request;
    Status parsed = ParseRequestHead(*head, request);
    int error_status = 400;
    std::string error_message;
    if (parsed.ok()) {
      auto framing = RequestFraming(request.headers);
      if (!framing.ok()) {
        error_message = framing.status().message();
      } else if (framing->kind == BodyFraming::kLength &&
                 framing->length > options_.max_body_bytes) {
        error_status = 413;
        error_message = "request body of " + std::to_string(framing->length) +
                        " bytes exceeds the limit of " + std::to_string(options_.max_body_bytes) +
                        " bytes";
      } else {
        auto body = connection->ReadBody(*framing, options_.max_body_bytes);
        if (!body.ok()) {
          if (body.status().code() != StatusCode::kInvalidArgument) break;
          error_status = 413;
          error_message = body.status().message();
        } else {
          request.body = std::move(*body);
        }
      }
    } else {
      error_message = parsed.message();
    }
    if (!error_message.empty()) {
      // The rest of the request is unread: answer and close.
      Response r = error_response(error_status, error_message);
      r.headers.Set("Connection", "close");
      ConnectionWriter(*connection, stopping_, false).Send(std::move(r)).ok();
      break;
    }
    ConnectionWriter writer(*connection, stopping_, request.method == "HEAD");
    handler_(request, writer);
    if (!writer.Finish()) break;
    auto conn_header = request.headers.Get("connection");
    if (conn_header && *conn_header == "close") break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_.remove(connection.get());
}

}  // namespace tidal::http
