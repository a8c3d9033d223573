// One conformance suite for every ObjectStore: file:// on a temporary directory, s3:// on a
// real S3-protocol server (moto on loopback, SigV4 verified), and the in-memory store a worker
// serves its peers from. All must behave the same to the checkpoint writer and reader: whole and
// ranged reads, NotFound, listing across pages, batched deletes, multipart uploads, and a failed
// Put that leaves the previous object in place.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <map>
#include <memory>

#include "tests/integration/objstore/fault_proxy.h"
#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/objstore/store_harness.h"
#include "worker/objstore/memory_store.h"
#include "worker/objstore/object_store.h"

namespace tidal::testing {
namespace {

using objstore::ObjectInfo;
using objstore::ObjectStore;
using objstore::OpenObjectStore;
using objstore::S3Options;

enum class Backend { kFile, kS3, kMemory };
void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kFile ? "file://" : backend == Backend::kS3 ? "s3://" : "mem://");
}

// The memory stores of one test by root, so that opening a root twice sees the same objects,
// as it does on a file system or a bucket. Each is bounded at 32 MiB.
constexpr uint64_t kMemoryCapacity = 32ull << 20;
class SharedMemoryStore final : public objstore::ObjectStore {
 public:
  explicit SharedMemoryStore(std::shared_ptr<objstore::MemoryStore> store)
      : store_(std::move(store)) {}
  std::string uri() const override { return store_->uri(); }
  Status Put(const std::string& k, std::string_view d) override { return store_->Put(k, d); }
  StatusOr<std::string> Get(const std::string& k) override { return store_->Get(k); }
  StatusOr<std::string> GetRange(const std::string& k, uint64_t o, uint64_t n) override {
    return store_->GetRange(k, o, n);
  }
  StatusOr<uint64_t> Size(const std::string& k) override { return store_->Size(k); }
  StatusOr<std::vector<ObjectInfo>> List(const std::string& p) override { return store_->List(p); }
  Status Delete(const std::vector<std::string>& k) override { return store_->Delete(k); }

 private:
  std::shared_ptr<objstore::MemoryStore> store_;
};

constexpr const char* kBucket = "ckpt";
constexpr const char* kRoot = "jobs/run-1";

class StoreConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kS3) {
      server_ = S3Server::Start(kBucket);
      ASSERT_TRUE(server_);
    }
    auto store = Open(kRoot);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }

  S3Options Options() const { return S3TestOptions(*server_, server_->endpoint()); }

  // A store rooted at `root` (a directory under the test's temp dir, or a prefix in the bucket).
  StatusOr<std::unique_ptr<ObjectStore>> Open(const std::string& root,
                                              const S3Options* options = nullptr) const {
    if (GetParam() == Backend::kFile) return OpenObjectStore("file://" + dir_.path() + "/" + root);
    if (GetParam() == Backend::kMemory) {
      auto& store = memory_[root];
      if (!store) store = std::make_shared<objstore::MemoryStore>(root, kMemoryCapacity);
      return std::unique_ptr<ObjectStore>(new SharedMemoryStore(store));
    }
    return OpenObjectStore(std::string("s3://") + kBucket + "/" + root,
                           options ? *options : Options());
  }

  static std::vector<std::string> Keys(const std::vector<ObjectInfo>& objects) {
    std::vector<std::string> keys;
    for (const ObjectInfo& o : objects) keys.push_back(o.key);
    return keys;
  }

  TempDir dir_;
  std::unique_ptr<S3Server> server_;
  mutable std::map<std::string, std::shared_ptr<objstore::MemoryStore>> memory_;
  std::unique_ptr<ObjectStore> store_;
};

TEST_P(StoreConformance, PutThenGetReturnsTheSameBytes) {
  const std::vector<std::pair<std::string, std::string>> objects = {
      {"step-00000015/manifest.json", "{\"step\": 15}"},
      {"step-00000015/shard-00000-of-00002.safetensors", TestBytes(100000, 1)},
      {"empty", ""},
      {"odd names/a b+c~d ü ĳ €.bin", TestBytes(77, 2)},  // spaces, '+', '~', unicode
      {"x/y/z/deep.bin", std::string("\0\x01\xff\r\n", 5)},
  };
  for (const auto& [key, data] : objects) TIDAL_ASSERT_OK(store_->Put(key, data));
  for (const auto& [key, data] : objects) {
    auto got = store_->Get(key);
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_EQ(*got, data) << key;
    auto size = store_->Size(key);
    ASSERT_TRUE(size.ok()) << key << ": " << size.status().ToString();
    EXPECT_EQ(*size, data.size()) << key;
  }
}

TEST_P(StoreConformance, OverwriteReplacesTheWholeObject) {
  TIDAL_ASSERT_OK(store_->Put("latest", "00000100"));
  TIDAL_ASSERT_OK(store_->Put("latest", "200"));
  EXPECT_EQ(store_->Get("latest").value(), "200");
  EXPECT_EQ(store_->Size("latest").value(), 3u);
  TIDAL_ASSERT_OK(store_->Put("latest", TestBytes(4096, 3)));
  EXPECT_EQ(store_->Get("latest").value(), TestBytes(4096, 3));
}

TEST_P(StoreConformance, MissingKeyIsNotFoundNamingTheKey) {
  TIDAL_ASSERT_OK(store_->Put("step-1/present", "x"));
  for (const Status& s :
       {store_->Get("step-1/absent").status(), store_->GetRange("step-1/absent", 0, 1).status(),
        store_->Size("step-1/absent").status(), store_->Get("no-such-dir/absent").status()}) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("absent"), std::string::npos) << s.message();
  }
  // A "directory" of the file store is not an object either.
  EXPECT_EQ(store_->Get("step-1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Size("step-1").status().code(), StatusCode::kNotFound);
}

TEST_P(StoreConformance, RangeReadsReturnExactlyTheAskedBytes) {
  const std::string data = TestBytes(1000, 4);
  TIDAL_ASSERT_OK(store_->Put("shard", data));
  struct Range {
    uint64_t offset, length;
  };
  // First byte (some servers answer "bytes=0-0" with the whole object: the store must cut it), the
  // start, the middle, the last byte, everything, and nothing at the very end.
  for (Range r : {Range{0, 1}, Range{0, 10}, Range{500, 37}, Range{999, 1}, Range{0, 1000},
                  Range{1000, 0}, Range{10, 0}}) {
    auto got = store_->GetRange("shard", r.offset, r.length);
    ASSERT_TRUE(got.ok()) << r.offset << "+" << r.length << ": " << got.status().ToString();
    EXPECT_EQ(*got, data.substr(r.offset, r.length)) << r.offset << "+" << r.length;
  }
  // Past the end, partly or wholly.
  for (Range r :
       {Range{995, 10}, Range{1000, 1}, Range{5000, 1}, Range{1001, 0}, Range{1, ~0ull}}) {
    Status s = store_->GetRange("shard", r.offset, r.length).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << r.offset << "+" << r.length;
    EXPECT_NE(s.message().find("past"), std::string::npos) << s.message();
  }
}

TEST_P(StoreConformance, ListsByPrefixAcrossPagesSorted) {
  std::vector<std::string> many;
  for (int i = 1004; i >= 0; --i) {
    char name[32];
    std::snprintf(name, sizeof(name), "many/%05d", i);
    many.push_back(name);
  }
  TIDAL_ASSERT_OK(PutMany(*store_, many, 3));
  TIDAL_ASSERT_OK(store_->Put("manyx", "not under many/"));
  TIDAL_ASSERT_OK(store_->Put("other/a", "1234"));
  std::vector<std::string> sorted = many;
  std::sort(sorted.begin(), sorted.end());

  // S3's page size (1000: two pages here), then small pages (five pages).
  S3Options small_pages = GetParam() == Backend::kS3 ? Options() : S3Options();
  small_pages.list_max_keys = 250;
  auto paged = Open(kRoot, &small_pages);
  ASSERT_TRUE(paged.ok()) << paged.status().ToString();
  for (ObjectStore* store : {store_.get(), paged->get()}) {
    auto listed = store->List("many/");
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    EXPECT_EQ(Keys(*listed), sorted);
    for (const ObjectInfo& o : *listed) EXPECT_EQ(o.size, 3u) << o.key;

    auto partial = store->List("many/0100");  // a prefix that ends mid-name
    ASSERT_TRUE(partial.ok()) << partial.status().ToString();
    EXPECT_EQ(Keys(*partial), (std::vector<std::string>{"many/01000", "many/01001", "many/01002",
                                                        "many/01003", "many/01004"}));

    auto everything = store->List("");
    ASSERT_TRUE(everything.ok()) << everything.status().ToString();
    EXPECT_EQ(everything->size(), many.size() + 2);
    EXPECT_TRUE(
        std::is_sorted(everything->begin(), everything->end(),
                       [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; }));
    EXPECT_EQ(everything->back().key, "other/a");
    EXPECT_EQ(everything->back().size, 4u);

    auto none = store->List("nothing-here/");
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_TRUE(none->empty());
  }
}

TEST_P(StoreConformance, ListIsScopedToTheStoreRoot) {
  // "jobs/run-10" starts with "jobs/run-1": its objects must not show in run-1's listing.
  auto sibling = Open("jobs/run-10");
  ASSERT_TRUE(sibling.ok()) << sibling.status().ToString();
  TIDAL_ASSERT_OK((*sibling)->Put("step-1/manifest.json", "other job"));
  TIDAL_ASSERT_OK(store_->Put("step-1/manifest.json", "this job"));
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(Keys(*listed), std::vector<std::string>{"step-1/manifest.json"});
  EXPECT_EQ(store_->Get("step-1/manifest.json").value(), "this job");
}

TEST_P(StoreConformance, DeletesManyKeysInBatches) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1001; ++i) keys.push_back("old/step-" + std::to_string(i));
  TIDAL_ASSERT_OK(PutMany(*store_, keys, 1));
  TIDAL_ASSERT_OK(store_->Put("keep/this", "kept"));
  std::vector<std::string> to_delete = keys;
  to_delete.push_back("old/never-written");  // absent keys are not an error
  TIDAL_ASSERT_OK(store_->Delete(to_delete));
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(Keys(*listed), std::vector<std::string>{"keep/this"});
  EXPECT_EQ(store_->Get("old/step-0").status().code(), StatusCode::kNotFound);
  TIDAL_ASSERT_OK(store_->Delete({}));
  TIDAL_ASSERT_OK(store_->Delete({"keep/this", "keep/this"}));
  EXPECT_EQ(store_->Size("keep/this").status().code(), StatusCode::kNotFound);
}

TEST_P(StoreConformance, LargeObjectGoesUpInPartsAndReadsBackEqual) {
  // 16 MiB in 5 MiB parts on s3://: 4 parts, the last 1 MiB.
  const std::string data = TestBytes(16 * kMiB, 5);
  TIDAL_ASSERT_OK(store_->Put("step-3/shard-00000-of-00001.safetensors", data));
  auto got = store_->Get("step-3/shard-00000-of-00001.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == data) << "16 MiB object read back differs";
  EXPECT_EQ(store_->Size("step-3/shard-00000-of-00001.safetensors").value(), data.size());
  // A range across the boundary of parts 1 and 2.
  auto across = store_->GetRange("step-3/shard-00000-of-00001.safetensors", 5 * kMiB - 3, 10);
  ASSERT_TRUE(across.ok()) << across.status().ToString();
  EXPECT_EQ(*across, data.substr(5 * kMiB - 3, 10));
}

TEST_P(StoreConformance, FailedLargePutKeepsThePreviousObject) {
  const std::string key = "step-4/shard.bin";
  TIDAL_ASSERT_OK(store_->Put(key, "previous version"));
  const std::string data = TestBytes(16 * kMiB, 6);
  Status failed;
  if (GetParam() == Backend::kFile) {
    // Files of at most 1 MiB: the write fails midway as on a full disk (EFBIG, not ENOSPC,
    // which would need a small mounted file system).
    struct sigaction ignore = {}, old_action = {};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
    rlimit old_limit;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    rlimit small = old_limit;
    small.rlim_cur = kMiB;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    failed = store_->Put(key, data);
    setrlimit(RLIMIT_FSIZE, &old_limit);
    sigaction(SIGXFSZ, &old_action, nullptr);
    EXPECT_NE(failed.message().find(dir_.path() + "/" + kRoot + "/" + key + ": File too large"),
              std::string::npos)
        << failed.message();
    EXPECT_EQ(TempFilesUnder(dir_.path()), std::vector<std::string>{});
  } else if (GetParam() == Backend::kMemory) {
    // Past the store's capacity: refused naming it, nothing changed.
    failed = store_->Put(key, data + data + data);
    EXPECT_EQ(failed.code(), StatusCode::kFailedPrecondition) << failed.ToString();
    EXPECT_NE(failed.message().find("over its capacity of " + std::to_string(kMemoryCapacity)),
              std::string::npos)
        << failed.message();
  } else {
    // Part 3 of 4 fails every time (500 InternalError, retried then given up).
    auto proxy = FaultProxy::Start(server_->port(), [](const http::Request& r) {
      std::optional<http::Response> answer;
      if (r.method == "PUT" && r.target.find("partNumber=3&") != std::string::npos)
        answer = FaultProxy::S3Error(500, "InternalError", "injected");
      return answer;
    });
    ASSERT_TRUE(proxy);
    S3Options options = S3TestOptions(*server_, proxy->endpoint());
    options.max_attempts = 2;
    auto through_proxy = Open(kRoot, &options);
    ASSERT_TRUE(through_proxy.ok()) << through_proxy.status().ToString();
    failed = (*through_proxy)->Put(key, data);
    EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
    EXPECT_NE(failed.message().find("PUT part 3 of 4 of s3://ckpt/jobs/run-1/step-4/shard.bin: "
                                    "HTTP 500 InternalError: injected (after 2 attempts)"),
              std::string::npos)
        << failed.message();
    // The upload was aborted, and never completed.
    const auto requests = proxy->requests();
    const std::string object = "/ckpt/jobs/run-1/step-4/shard.bin?uploadId=";
    auto sent = [&](const std::string& method) {
      return std::count_if(requests.begin(), requests.end(), [&](const std::string& line) {
        return line.rfind(method + " " + object, 0) == 0;
      });
    };
    EXPECT_EQ(sent("DELETE"), 1) << ::testing::PrintToString(requests);
    EXPECT_EQ(sent("POST"), 0) << ::testing::PrintToString(requests);
    EXPECT_EQ(proxy->checksum_errors(), std::vector<std::string>{});
  }
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(store_->Get(key).value(), "previous version");
  auto listed = store_->List("step-4/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().size, std::string("previous version").size());
}

TEST_P(StoreConformance, InvalidKeysAreRefusedNamingTheKey) {
  for (const std::string& key : {std::string("../escape"), std::string("/abs"), std::string("a//b"),
                                 std::string("a/./b"), std::string("")}) {
    for (const Status& s :
         {store_->Put(key, "x"), store_->Get(key).status(), store_->GetRange(key, 0, 1).status(),
          store_->Size(key).status(), store_->Delete({"fine", key})}) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "\"" << key << "\": " << s.ToString();
      if (!key.empty())
        EXPECT_NE(s.message().find("\"" + key + "\""), std::string::npos) << s.message();
    }
  }
  EXPECT_EQ(store_->List("../").status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance,
                         ::testing::Values(Backend::kFile, Backend::kS3, Backend::kMemory),
                         [](const auto& info) {
                           return info.param == Backend::kFile ? std::string("File")
                                  : info.param == Backend::kS3 ? std::string("S3")
                                                               : std::string("Memory");
                         });

}  // namespace
}  // namespace tidal::testing
