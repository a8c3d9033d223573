// common/metrics/endpoint.h — what every binary's Prometheus metrics share (prometheus-cpp
// core): the /metrics endpoint and histogram bucket layouts. Each binary defines its metrics in
// one place of its own (operator/controller/metrics.h, worker/control/metrics.h).
//
// The endpoint is the project's own HTTP server (common/http), not prometheus-cpp's civetweb
// Exposer: civetweb starts its threads with a 100 KiB stack, and a worker that has loaded
// LibTorch and the CUDA libraries needs about 190 KiB of static TLS per thread (cuBLASLt alone
// 94 KiB), so pthread_create refused every civetweb thread and /metrics never served.
#pragma once

#include <memory>
#include <string>

#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/status.h"

namespace tidal::http {
class Server;
}

namespace tidal::metrics {

// Serves a registry in the Prometheus text format at http://ADDRESS/metrics.
class Endpoint {
 public:
  // `address` is "host:port" (":port" or a bare port listens on every interface); port 0
  // picks a free one, see port(). Unavailable, naming the address, when it cannot listen.
  static StatusOr<std::unique_ptr<Endpoint>> Start(
      const std::string& address, const std::shared_ptr<prometheus::Registry>& registry);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int port() const;

 private:
  explicit Endpoint(std::unique_ptr<http::Server> server);
  std::unique_ptr<http::Server> server_;
};

// `count` upper bounds start, start·factor, start·factor², ... (the +Inf bucket is implied).
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count);

}  // namespace tidal::metrics
