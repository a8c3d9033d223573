#include "common/metrics/endpoint.h"

#include <chrono>
#include <stdexcept>

#include <prometheus/text_serializer.h>

#include "common/http/server.h"

namespace tidal::metrics {

Endpoint::Endpoint(std::unique_ptr<http::Server> server) : server_(std::move(server)) {}

Endpoint::~Endpoint() {
  if (server_) server_->Stop();
}

int Endpoint::port() const { return server_->port(); }

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Start(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  http::ServerOptions options;
  // "host:port", ":port" or "port": no host listens on every interface.
  const auto colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? address : address.substr(colon + 1);
  options.host = host.empty() ? "0.0.0.0" : host;
  try {
    size_t used = 0;
    options.port = std::stoi(port, &used);
    if (used != port.size() || options.port < 0 || options.port > 65535)
      throw std::out_of_range("");
  } catch (const std::exception&) {
    return InvalidArgument("cannot serve /metrics on \"" + address +
                           "\": expected HOST:PORT, :PORT or PORT");
  }
  options.io_timeout = std::chrono::seconds(30);
  auto server = http::Server::Start(
      std::move(options), [registry](const http::Request& request, http::ResponseWriter& w) {
        http::Response response;
        if (request.path != "/metrics") {
          response.status = 404;
          response.headers.Set("Content-Type", "text/plain; charset=utf-8");
          response.body = "only /metrics is served here\n";
        } else if (request.method != "GET" && request.method != "HEAD") {
          response.status = 405;
          response.headers.Set("Allow", "GET, HEAD");
        } else {
          response.headers.Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
          if (request.method == "GET")
            response.body = prometheus::TextSerializer().Serialize(registry->Collect());
        }
        (void)w.Send(std::move(response));
      });
  if (!server.ok())
    return Unavailable("cannot serve /metrics on " + address + ": " + server.status().message());
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(*server)));
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

}  // namespace tidal::metrics
