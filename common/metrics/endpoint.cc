#include "common/metrics/endpoint.h"

#include <exception>

#include <prometheus/exposer.h>

namespace tidal::metrics {

Endpoint::Endpoint(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

Endpoint::~Endpoint() = default;

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Start(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  std::string bind = address;
  if (!bind.empty() && bind.front() == ':') bind.erase(0, 1);  // civetweb: "port" = any address
  std::unique_ptr<prometheus::Exposer> exposer;
  try {  // civetweb reports a port it cannot bind by throwing
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return Unavailable("cannot serve /metrics on " + address + ": " + e.what());
  }
  exposer->RegisterCollectable(registry);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) return Unavailable("cannot serve /metrics on " + address + ": no port");
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(exposer), ports.front()));
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

}  // namespace tidal::metrics
