// tests/unit/engine/multi_rank.h — runs a function on W ranks as threads of this process,
// each joined to a real gloo process group over loopback through a real TCPStore.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "worker/engine/comm.h"

namespace tidal::engine::testing {

inline void RunRanks(int world, const std::function<void(Comm&)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto server = StoreServer::Start("127.0.0.1");
  ASSERT_TRUE(server.ok()) << server.status().message();
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      ProcessGroupOptions options;
      options.store_port = (*server)->port();
      options.rank = rank;
      options.world_size = world;
      options.timeout = timeout;
      auto comm = ConnectProcessGroup(options);
      if (!comm.ok()) {
        failures[rank] = comm.status().message();
        return;
      }
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

}  // namespace tidal::engine::testing
