// What only the file:// store has to get right: the temp-file + fsync + rename protocol leaves
// no temporaries behind, a failed Put leaves the old object intact with an error that names
// the path and the system's reason, and Delete prunes the directories it empties.
#include "worker/objstore/file_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/objstore/store_harness.h"

namespace tidal::testing {
namespace {

namespace fs = std::filesystem;
using objstore::FileStore;

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/ckpt";
    auto store = FileStore::Open(root_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  TempDir dir_;
  std::string root_;
  std::unique_ptr<FileStore> store_;
};

TEST_F(FileStoreTest, PutsLeaveNoTemporaryFilesAndCreateParents) {
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 20; ++i)
      TIDAL_ASSERT_OK(
          store_->Put("step-" + std::to_string(i) + "/deep/er/shard", TestBytes(1000 + round, i)));
  EXPECT_EQ(TempFilesUnder(root_), std::vector<std::string>{});
  EXPECT_TRUE(fs::is_directory(root_ + "/step-7/deep/er"));
  EXPECT_EQ(ReadFile(root_ + "/step-7/deep/er/shard"), TestBytes(1002, 7));
}

TEST_F(FileStoreTest, ListSkipsTemporaryFilesOfACrashedWriter) {
  TIDAL_ASSERT_OK(store_->Put("step-1/manifest.json", "{}"));
  // What a writer killed between create and rename leaves behind.
  std::ofstream(root_ + "/step-1/" + std::string(objstore::kTempPrefix) + "shard.1234abcd")
      << "partial";
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().key, "step-1/manifest.json");
}

TEST_F(FileStoreTest, PutOverADirectoryFailsAndKeepsWhatIsThere) {
  TIDAL_ASSERT_OK(store_->Put("a/b", "inner"));
  Status s = store_->Put("a", "would replace a directory");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(root_ + "/a: Is a directory"), std::string::npos) << s.message();
  EXPECT_EQ(store_->Get("a/b").value(), "inner");
  EXPECT_EQ(TempFilesUnder(root_), std::vector<std::string>{});
}

TEST_F(FileStoreTest, PutBelowAFileFailsAndKeepsTheFile) {
  TIDAL_ASSERT_OK(store_->Put("a", "a file"));
  Status s = store_->Put("a/b", "x");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(root_ + "/a is a file: Not a directory"), std::string::npos)
      << s.message();
  EXPECT_EQ(store_->Get("a").value(), "a file");
}

TEST_F(FileStoreTest, PutIntoAReadOnlyDirectoryFailsAndKeepsTheOldObject) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TIDAL_ASSERT_OK(store_->Put("step-1/latest", "1"));
  ASSERT_EQ(chmod((root_ + "/step-1").c_str(), 0555), 0);
  Status s = store_->Put("step-1/latest", "2");
  chmod((root_ + "/step-1").c_str(), 0755);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("Permission denied"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(root_ + "/step-1/latest"), std::string::npos) << s.message();
  EXPECT_EQ(store_->Get("step-1/latest").value(), "1");
}

TEST_F(FileStoreTest, DeletePrunesDirectoriesItEmpties) {
  TIDAL_ASSERT_OK(store_->Put("step-1/x/a", "1"));
  TIDAL_ASSERT_OK(store_->Put("step-1/x/b", "2"));
  TIDAL_ASSERT_OK(store_->Put("step-2/c", "3"));
  TIDAL_ASSERT_OK(store_->Delete({"step-1/x/a", "step-1/x/b"}));
  EXPECT_FALSE(fs::exists(root_ + "/step-1"));
  EXPECT_TRUE(fs::exists(root_ + "/step-2/c"));
  EXPECT_TRUE(fs::is_directory(root_));  // never the root itself
  TIDAL_ASSERT_OK(store_->Delete({"step-2/c"}));
  EXPECT_TRUE(fs::is_directory(root_));
  // A key under a pruned directory can be written again.
  TIDAL_ASSERT_OK(store_->Put("step-1/x/a", "again"));
  EXPECT_EQ(store_->Get("step-1/x/a").value(), "again");
}

TEST_F(FileStoreTest, DeletingADirectoryKeyIsANoOp) {
  TIDAL_ASSERT_OK(store_->Put("d/e", "x"));
  TIDAL_ASSERT_OK(store_->Delete({"d"}));
  EXPECT_EQ(store_->Get("d/e").value(), "x");
}

TEST_F(FileStoreTest, OpenRefusesRelativeAndFileSystemRoots) {
  EXPECT_EQ(FileStore::Open("relative").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FileStore::Open("/").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FileStore::Open("/a/..").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tidal::testing
