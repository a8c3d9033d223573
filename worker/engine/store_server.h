// worker/engine/store_server.h — the rendezvous store (a c10d TCPStore) a launcher hosts for
// its ranks, as torchrun's agent does, on a port the kernel picks so concurrent runs never
// collide. No LibTorch types here: launchers outside worker/engine include this header.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace tidal::engine {

class StoreServer {
 public:
  // port 0: the kernel picks a free one.
  static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port = 0);
  virtual ~StoreServer() = default;
  virtual int port() const = 0;
};

}  // namespace tidal::engine
