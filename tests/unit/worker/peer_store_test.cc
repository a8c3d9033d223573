// PeerStore: which old rank holds which object of a live checkpoint, and what it refuses. The
// reads themselves run against real workers in worker_control_test.cc.
#include "worker/control/peer_store.h"

#include <gtest/gtest.h>

namespace tidal::worker {
namespace {

PeerStore Store(size_t peers) {
  std::vector<std::string> addresses;
  for (size_t i = 0; i < peers; ++i)
    addresses.push_back("127.0.0." + std::to_string(20 + i) + ":1");
  contract::ClientOptions client;
  client.token = "t";
  client.timeout = std::chrono::seconds(2);
  return PeerStore(addresses, client);
}

TEST(PeerStore, ShardKOfWIsReadFromOldRankKAndEverythingElseFromRankZero) {
  PeerStore store = Store(3);
  EXPECT_EQ(store.uri(), "peers://127.0.0.20:1,127.0.0.21:1,127.0.0.22:1");
  EXPECT_EQ(store.Owner("step-00000012/shard-00001-of-00003.safetensors").value(), 0u);
  EXPECT_EQ(store.Owner("step-00000012/shard-00002-of-00003.safetensors").value(), 1u);
  EXPECT_EQ(store.Owner("step-00000012/shard-00003-of-00003.safetensors").value(), 2u);
  EXPECT_EQ(store.Owner("step-00000012/manifest.json").value(), 0u);
  EXPECT_EQ(store.Owner("step-00000012/trainer_state.json").value(), 0u);
  // Not shard names: rank 0's (where they are then missing, and say so).
  for (const char* key :
       {"step-1/shard-00000-of-00003.safetensors", "step-1/shard-0001-of-00003.safetensors",
        "step-1/shard-00004-of-00003.safetensors", "step-1/shard-0000x-of-00003.safetensors"})
    EXPECT_EQ(store.Owner(key).value(), 0u) << key;
}

TEST(PeerStore, AShardOfAnotherWorldSizeOrABadKeyIsRefusedNamingIt) {
  PeerStore store = Store(2);
  Status other = store.Owner("step-00000012/shard-00001-of-00004.safetensors").status();
  EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("a shard of 4 ranks, but the previous generation had 2"),
            std::string::npos)
      << other.message();
  EXPECT_EQ(store.Get("../escape").status().code(), StatusCode::kInvalidArgument);
}

TEST(PeerStore, ItIsReadOnlyAndCannotList) {
  PeerStore store = Store(1);
  EXPECT_EQ(store.Put("step-1/manifest.json", "{}").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Delete({"step-1/manifest.json"}).code(), StatusCode::kFailedPrecondition);
  Status listed = store.List("step-").status();
  EXPECT_EQ(listed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(listed.message().find("the Rendezvous names the step"), std::string::npos);
}

TEST(PeerStore, APeerThatIsGoneIsUnavailableNamingIt) {
  PeerStore store = Store(2);  // nothing listens on port 1
  Status s = store.GetRange("step-00000012/shard-00002-of-00002.safetensors", 0, 8).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message().rfind("127.0.0.21:1: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace tidal::worker
