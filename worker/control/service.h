// worker/control/service.h — the worker's gRPC server (tidal.worker.v1.WorkerControl) over a
// WorkerRuntime. Every method checks the job token first (`authorization: Bearer <token>`,
// compared in constant time): without it the call is UNAUTHENTICATED and reaches nothing.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/control/runtime.h"

namespace tidal::worker {

struct ControlServerOptions {
  std::string listen = "127.0.0.1:0";     // HOST:PORT; port 0 picks a free one
  std::string token;                      // the job token; must not be empty
  std::string tls_cert_pem, tls_key_pem;  // both set: TLS; both empty: plaintext
  // Called (once, off the RPC thread) after a Shutdown call has been answered.
  std::function<void()> on_shutdown;
};

class ControlServer {
 public:
  static StatusOr<std::unique_ptr<ControlServer>> Start(WorkerRuntime& runtime,
                                                        ControlServerOptions options);
  virtual ~ControlServer() = default;
  virtual int port() const = 0;
  // Stops accepting calls; ends open streams; returns when every handler has returned.
  virtual void Stop() = 0;
};

}  // namespace tidal::worker
