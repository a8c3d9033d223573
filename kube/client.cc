// kube/client.cc
#include "kube/client.h"

namespace tidal::kube {

StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(const Connection& connection) {
  TIDAL_ASSIGN_OR_RETURN(http::Origin origin, http::ParseOrigin(connection.server));
  http::ClientOptions options;
  options.origin = origin;
  if (origin.scheme == "https") {
    TIDAL_ASSIGN_OR_RETURN(options.tls,
                           http::TlsContext::Client(connection.ca_pem, connection.client_cert_pem,
                                                    connection.client_key_pem));
  }
  TIDAL_ASSIGN_OR_RETURN(auto http, http::Client::Create(options));
  return std::unique_ptr<KubeClient>(new KubeClient(connection, std::move(http)));
}

http::Request KubeClient::ToHttp(const Request& request) const {
  http::Request out;
  out.method = request.method;
  out.target = request.Target();
  out.headers.Set("Accept", "application/json");
  out.headers.Set("User-Agent", "tidal-operator");
  if (!connection_.token.empty()) out.headers.Set("Authorization", "Bearer " + connection_.token);
  if (request.body) {
    out.body = *request.body;
    out.headers.Set("Content-Type",
                    request.content_type.empty() ? "application/json" : request.content_type);
  }
  return out;
}

StatusOr<ApiResponse> KubeClient::Send(const Request& request) {
  const auto start = std::chrono::steady_clock::now();
  StatusOr<http::Response> sent = http_->Send(ToHttp(request));
  Observe(request, /*watch=*/false, sent.ok() ? sent->status : 0, start);
  TIDAL_ASSIGN_OR_RETURN(http::Response response, std::move(sent));
  ApiResponse out;
  out.code = response.status;
  out.body = nlohmann::json::parse(response.body, nullptr, false);
  if (out.body.is_discarded()) out.body = response.body;  // plain text (logs) or junk
  return out;
}

StatusOr<nlohmann::json> KubeClient::Call(const Request& request) {
  TIDAL_ASSIGN_OR_RETURN(ApiResponse response, Send(request));
  if (response.code / 100 == 2) return std::move(response.body);
  return StatusFromResponse(response);
}

StatusOr<std::unique_ptr<WatchStream>> KubeClient::Watch(const Request& request,
                                                         std::chrono::milliseconds idle_timeout) {
  const auto start = std::chrono::steady_clock::now();
  auto opened = http_->Stream(ToHttp(request), idle_timeout);
  Observe(request, /*watch=*/true, opened.ok() ? (*opened)->head().status : 0, start);
  TIDAL_ASSIGN_OR_RETURN(auto stream, std::move(opened));
  if (stream->head().status / 100 != 2) {
    ApiResponse response;
    response.code = stream->head().status;
    response.body = nlohmann::json::parse(stream->head().body, nullptr, false);
    return StatusFromResponse(response);
  }
  return std::make_unique<WatchStream>(std::move(stream));
}

StatusOr<std::optional<WatchEventJson>> WatchStream::Next() {
  for (;;) {
    TIDAL_ASSIGN_OR_RETURN(auto line, stream_->ReadLine());
    if (!line) return std::optional<WatchEventJson>();
    if (line->empty()) continue;
    auto event = nlohmann::json::parse(*line, nullptr, false);
    if (event.is_discarded() || !event.is_object() || !event.contains("type") ||
        !event["type"].is_string())
      return Unavailable("watch: malformed event from the server");
    WatchEventJson out{event["type"], event.value("object", nlohmann::json::object())};
    if (out.type == "ERROR") {
      ApiResponse response{out.object.value("code", 500), out.object};
      return StatusFromResponse(response);
    }
    return std::optional<WatchEventJson>(std::move(out));
  }
}

Status StatusFromResponse(const ApiResponse& response) {
  const nlohmann::json& body = response.body;
  std::string message = body.is_object() && body.contains("message") && body["message"].is_string()
                            ? body["message"].get<std::string>()
                            : "HTTP " + std::to_string(response.code);
  // metav1.Status.reason tells a 409's two kinds apart (k8s.io/apimachinery StatusReason).
  const std::string reason =
      body.is_object() && body.contains("reason") && body["reason"].is_string()
          ? body["reason"].get<std::string>()
          : "";
  switch (response.code) {
    case 400:
    case 422:
      return InvalidArgument(message);
    case 404:
      return NotFound(message);
    case 409:
      return reason == "AlreadyExists" ? AlreadyExists(message) : Aborted(message);
    case 410:
      return Expired(message);
    case 401:
      return Unauthenticated(message);
    case 403:
      return PermissionDenied(message);
    default:
      return response.code == 429 || response.code >= 500
                 ? Unavailable(message)
                 : Internal("HTTP " + std::to_string(response.code) + ": " + message);
  }
}

}  // namespace tidal::kube
