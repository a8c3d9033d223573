// common/http/client.h — an HTTP/1.1 client for one origin (scheme, host, port), plain or
// TLS, keeping idle connections for reuse. Whole responses for ordinary calls; streamed
// responses (chunked, line-delimited) for watches, readable line by line and cancellable
// from another thread.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/http/connection.h"
#include "common/http/message.h"
#include "common/status.h"

namespace tidal::http {

struct Origin {
  std::string scheme;  // http | https
  std::string host;
  int port = 0;
};
// "https://127.0.0.1:6443" (a trailing path is refused: the API server is at the root).
StatusOr<Origin> ParseOrigin(const std::string& url);

struct ClientOptions {
  Origin origin;
  std::shared_ptr<TlsContext> tls;  // required for https
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
  size_t max_response_bytes = 256 * 1024 * 1024;
};

// A streamed response body. ReadLine returns the next '\n'-terminated line (without it),
// nullopt at the end of the stream.
class ResponseStream {
 public:
  ResponseStream(std::unique_ptr<Connection> connection, Response head, BodyFraming framing)
      : connection_(std::move(connection)), head_(std::move(head)), framing_(framing) {}
  const Response& head() const { return head_; }
  StatusOr<std::optional<std::string>> ReadLine();
  // From any thread: makes a blocked ReadLine return.
  void Cancel() { connection_->Shutdown(); }

 private:
  std::unique_ptr<Connection> connection_;
  Response head_;
  BodyFraming framing_;
  std::string pending_;
  bool ended_ = false;
};

class Client {
 public:
  static StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);

  // Sends `request` (Host and Content-Length are filled in) and reads the whole response.
  StatusOr<Response> Send(Request request);
  // Sends `request` and returns once the response head has arrived; non-2xx answers are read
  // whole and returned as the stream's head with the body in head().body.
  StatusOr<std::unique_ptr<ResponseStream>> Stream(Request request,
                                                   std::chrono::milliseconds read_timeout);

 private:
  explicit Client(ClientOptions options) : options_(std::move(options)) {}
  StatusOr<std::unique_ptr<Connection>> Checkout(bool& reused);
  void Return(std::unique_ptr<Connection> connection);
  void Prepare(Request& request) const;

  ClientOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace tidal::http
