// common/http/client.cc
#include "common/http/client.h"

#include <charconv>

namespace tidal::http {
namespace {
constexpr size_t kMaxIdleConnections = 8;
constexpr size_t kMaxHeadBytes = 1024 * 1024;
}  // namespace

StatusOr<Origin> ParseOrigin(const std::string& url) {
  Origin origin;
  size_t sep = url.find("://");
  if (sep == std::string::npos)
    return InvalidArgument("server: expected scheme://host:port, got \"" + url + "\"");
  origin.scheme = url.substr(0, sep);
  if (origin.scheme != "http" && origin.scheme != "https")
    return InvalidArgument("server: expected http or https, got \"" + origin.scheme + "\"");
  std::string rest = url.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return InvalidArgument("server: a path after the host is not supported, got \"" + url + "\"");
  std::string port_text;
  if (!rest.empty() && rest.front() == '[') {  // [::1]:443
    size_t close = rest.find(']');
    if (close == std::string::npos) return InvalidArgument("server: unterminated IPv6 address");
    origin.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port_text = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    origin.host = rest.substr(0, colon);
    if (colon != std::string::npos) port_text = rest.substr(colon + 1);
  }
  if (origin.host.empty()) return InvalidArgument("server: missing host in \"" + url + "\"");
  if (port_text.empty()) {
    origin.port = origin.scheme == "https" ? 443 : 80;
  } else {
    auto [ptr, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), origin.port);
    if (ec != std::errc() || ptr != port_text.data() + port_text.size() || origin.port <= 0 ||
        origin.port > 65535)
      return InvalidArgument("server: bad port \"" + port_text + "\"");
  }
  return origin;
}

StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.origin.scheme == "https" && !options.tls)
    return InvalidArgument("https server needs a certificate authority to verify it against");
  return std::unique_ptr<Client>(new Client(std::move(options)));
}

StatusOr<std::unique_ptr<Connection>> Client::Checkout(bool& reused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      if (c->PeerClosed()) continue;
      reused = true;
      return c;
    }
  }
  reused = false;
  const Origin& o = options_.origin;
  return Connection::Dial(o.host, o.port, o.scheme == "https" ? options_.tls : nullptr,
                          options_.connect_timeout);
}

void Client::Return(std::unique_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(connection));
}

void Client::Prepare(Request& request) const {
  const Origin& o = options_.origin;
  bool default_port =
      (o.scheme == "https" && o.port == 443) || (o.scheme == "http" && o.port == 80);
  std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  // A Host the caller set is kept (a proxy forwards the one a request was signed with).
  if (!request.headers.Has("Host"))
    request.headers.Set("Host", default_port ? host : host + ":" + std::to_string(o.port));
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
      request.method == "PATCH")
    request.headers.Set("Content-Length", std::to_string(request.body.size()));
}

StatusOr<Response> Client::Send(Request request) {
  Prepare(request);
  std::string wire = SerializeRequestHead(request) + request.body;
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    TIDAL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection, Checkout(reused));
    connection->SetReadTimeout(options_.request_timeout);
    Status written = connection->WriteAll(wire);
    StatusOr<std::string> head =
        written.ok() ? connection->ReadHead(kMaxHeadBytes) : StatusOr<std::string>(written);
    if (!head.ok()) {
      // A kept-alive connection the server closed meanwhile: try once on a fresh one.
      if (reused && attempt == 0 && head.status().code() != StatusCode::kDeadlineExceeded) continue;
      return head.status();
    }
    Response response;
    TIDAL_RETURN_IF_ERROR(ParseResponseHead(*head, response));
    TIDAL_ASSIGN_OR_RETURN(BodyFraming framing,
                           ResponseFraming(request.method, response.status, response.headers));
    TIDAL_ASSIGN_OR_RETURN(response.body,
                           connection->ReadBody(framing, options_.max_response_bytes));
    auto conn_header = response.headers.Get("connection");
    if (framing.kind != BodyFraming::kUntilClose && !(conn_header && *conn_header == "close"))
      Return(std::move(connection));
    return response;
  }
}

StatusOr<std::unique_ptr<ResponseStream>> Client::Stream(Request request,
                                                         std::chrono::milliseconds read_timeout) {
  Prepare(request);
  const Origin& o = options_.origin;
  // Streams get their own connection: they live long and are not reusable after a cancel.
  TIDAL_ASSIGN_OR_RETURN(
      std::unique_ptr<Connection> connection,
      Connection::Dial(o.host, o.port, o.scheme == "https" ? options_.tls : nullptr,
                       options_.connect_timeout));
  connection->SetReadTimeout(options_.request_timeout);
  TIDAL_RETURN_IF_ERROR(connection->WriteAll(SerializeRequestHead(request) + request.body));
  TIDAL_ASSIGN_OR_RETURN(std::string head, connection->ReadHead(kMaxHeadBytes));
  Response response;
  TIDAL_RETURN_IF_ERROR(ParseResponseHead(head, response));
  TIDAL_ASSIGN_OR_RETURN(BodyFraming framing,
                         ResponseFraming(request.method, response.status, response.headers));
  if (response.status / 100 != 2) {
    TIDAL_ASSIGN_OR_RETURN(response.body,
                           connection->ReadBody(framing, options_.max_response_bytes));
    framing = BodyFraming{};
  }
  connection->SetReadTimeout(read_timeout);
  return std::make_unique<ResponseStream>(std::move(connection), std::move(response), framing);
}

StatusOr<std::optional<std::string>> ResponseStream::ReadLine() {
  constexpr size_t kMaxLine = 64 * 1024 * 1024;
  for (;;) {
    size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return std::optional<std::string>(std::move(line));
    }
    if (ended_) {
      if (pending_.empty()) return std::optional<std::string>();
      std::string last = std::move(pending_);
      pending_.clear();
      return std::optional<std::string>(std::move(last));
    }
    if (framing_.kind == BodyFraming::kChunked) {
      TIDAL_ASSIGN_OR_RETURN(auto chunk, connection_->ReadChunk(kMaxLine));
      if (!chunk) {
        ended_ = true;
        continue;
      }
      pending_ += *chunk;
    } else {
      TIDAL_ASSIGN_OR_RETURN(std::string rest, connection_->ReadBody(framing_, kMaxLine));
      pending_ += rest;
      ended_ = true;
    }
  }
}

}  // namespace tidal::http
