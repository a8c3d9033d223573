// kube/client.h — sends what the pure request builders (request.h) describe to an API
// server over verified TLS with the connection's credentials, and maps Kubernetes Status
// answers onto Status codes by kind, never by message: 404 NotFound, 409 AlreadyExists (reason
// AlreadyExists) or Aborted (a Conflict: re-read and retry), 400/422 InvalidArgument, 401
// Unauthenticated, 403 PermissionDenied, 410 Expired (relist), 429/5xx Unavailable. Watches
// stream events line by line.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http/client.h"
#include "common/status.h"
#include "kube/config.h"
#include "kube/request.h"

namespace tidal::kube {

struct ApiResponse {
  int code = 0;
  nlohmann::json body;
};

struct WatchEventJson {
  std::string type;  // ADDED MODIFIED DELETED BOOKMARK ERROR
  nlohmann::json object;
};

class WatchStream {
 public:
  explicit WatchStream(std::unique_ptr<http::ResponseStream> stream) : stream_(std::move(stream)) {}
  // The next event; nullopt when the server ended the watch (timeout): watch again from the
  // last version seen.
  StatusOr<std::optional<WatchEventJson>> Next();
  void Cancel() { stream_->Cancel(); }

 private:
  std::unique_ptr<http::ResponseStream> stream_;
};

class KubeClient {
 public:
  static StatusOr<std::unique_ptr<KubeClient>> Create(const Connection& connection);
  const Connection& connection() const { return connection_; }

  // The answer whatever its code (transport failures are the only errors).
  StatusOr<ApiResponse> Send(const Request& request);
  // The body of a 2xx answer, else the mapped error with the server's message.
  StatusOr<nlohmann::json> Call(const Request& request);
  // Opens a watch; a non-2xx answer becomes the mapped error.
  StatusOr<std::unique_ptr<WatchStream>> Watch(const Request& request,
                                               std::chrono::milliseconds idle_timeout);

  // Told of every request's outcome: the HTTP status, or 0 when no answer came, and how long
  // the answer took (a watch's: to open). Set it before the client is shared; it is called
  // from whichever thread sent the request.
  using Observer =
      std::function<void(const Request& request, bool watch, int code, double seconds)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  KubeClient(Connection connection, std::unique_ptr<http::Client> http)
      : connection_(std::move(connection)), http_(std::move(http)) {}
  http::Request ToHttp(const Request& request) const;

  void Observe(const Request& request, bool watch, int code,
               std::chrono::steady_clock::time_point sent) const {
    if (observer_)
      observer_(request, watch, code,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
  }

  Connection connection_;
  std::unique_ptr<http::Client> http_;
  Observer observer_;
};

// Maps a non-2xx answer to a Status naming the server's message.
Status StatusFromResponse(const ApiResponse& response);

}  // namespace tidal::kube
