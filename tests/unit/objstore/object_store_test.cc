// Keys, URIs and s3:// settings: every kind of bad input is refused with a message naming it.
#include "worker/objstore/object_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "worker/objstore/file_store.h"
#include "worker/objstore/object_key.h"
#include "worker/objstore/s3_store.h"

namespace tidal::objstore {
namespace {

namespace fs = std::filesystem;

// A unique temporary directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tidal-objstore-unit-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void ExpectInvalid(const Status& status, const std::string& needle) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find(needle), std::string::npos)
      << "\"" << needle << "\" not in: " << status.message();
}

S3Options GoodOptions() {
  S3Options o;
  o.endpoint = "http://127.0.0.1:9000";
  o.access_key_id = "AKID";
  o.secret_access_key = "SECRET";
  return o;
}

TEST(ObjectKey, AcceptsRelativeSlashSeparatedUtf8Keys) {
  for (const char* key : {"manifest.json", "step-00000015/manifest.json", "a b/c+d~e/ü.bin",
                          "..hidden/x", ".x", "a/.tidal-tmp"})
    EXPECT_TRUE(ValidateKey(key).ok()) << key << ": " << ValidateKey(key).ToString();
}

TEST(ObjectKey, RefusesKeysAFileSystemWouldReinterpret) {
  ExpectInvalid(ValidateKey(""), "object key is empty");
  ExpectInvalid(ValidateKey("/abs/key"), "\"/abs/key\": must be relative");
  ExpectInvalid(ValidateKey("a//b"), "\"a//b\": empty path segment");
  ExpectInvalid(ValidateKey("a/"), "\"a/\": empty path segment");
  ExpectInvalid(ValidateKey("../escape"), "\"../escape\": \".\" and \"..\"");
  ExpectInvalid(ValidateKey("a/../b"), "\"a/../b\"");
  ExpectInvalid(ValidateKey("a/./b"), "\"a/./b\"");
  ExpectInvalid(ValidateKey("a/.tidal-tmp-x"), "reserved for the file store");
  ExpectInvalid(ValidateKey(std::string("a\nb")), "control character");
  ExpectInvalid(ValidateKey("bad\xff"), "not valid UTF-8");
  ExpectInvalid(ValidateKey(std::string(1025, 'k')), "longer than 1024 bytes");
}

TEST(ObjectKey, PrefixesMayEndInASlashOrMidName) {
  for (const char* prefix : {"", "step-", "step-00000015/", "step-00000015/shard-0", "a/."})
    EXPECT_TRUE(ValidatePrefix(prefix).ok()) << prefix;
  ExpectInvalid(ValidatePrefix("/abs"), "must be relative");
  ExpectInvalid(ValidatePrefix("a//b"), "empty path segment");
  ExpectInvalid(ValidatePrefix("../"), "\"..\"");
}

TEST(OpenObjectStore, OpensFileStoresFromEachAcceptedForm) {
  TempDir dir;
  auto abs = OpenObjectStore(dir.path() + "/plain/");
  ASSERT_TRUE(abs.ok()) << abs.status().ToString();
  EXPECT_EQ((*abs)->uri(), "file://" + dir.path() + "/plain");
  auto uri = OpenObjectStore("file://" + dir.path() + "/x/../uri");
  ASSERT_TRUE(uri.ok()) << uri.status().ToString();
  EXPECT_EQ((*uri)->uri(), "file://" + dir.path() + "/uri");

  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  auto relative = OpenObjectStore("file://rel/dir");
  fs::current_path(cwd);
  ASSERT_TRUE(relative.ok()) << relative.status().ToString();
  EXPECT_EQ((*relative)->uri(), "file://" + dir.path() + "/rel/dir");
  EXPECT_TRUE(fs::is_directory(dir.path() + "/rel/dir"));
}

TEST(OpenObjectStore, RefusesUnknownSchemesAndEmptyParts) {
  for (const char* uri : {"", "gs://bucket/x", "relative/dir", "http://host/x", "S3://b/x"})
    ExpectInvalid(OpenObjectStore(uri).status(), "expected file:///abs/dir");
  ExpectInvalid(OpenObjectStore("file://").status(), "the path is empty");
  ExpectInvalid(OpenObjectStore("s3:///prefix", GoodOptions()).status(), "the bucket is empty");
  ExpectInvalid(OpenObjectStore("s3://Bad_Bucket/x", GoodOptions()).status(),
                "s3 bucket \"Bad_Bucket\"");
  ExpectInvalid(OpenObjectStore("s3://ab/x", GoodOptions()).status(), "3 to 63 characters");
  ExpectInvalid(OpenObjectStore("s3://192.168.1.1/x", GoodOptions()).status(), "IP address");
  ExpectInvalid(OpenObjectStore("s3://bucket/a//b", GoodOptions()).status(),
                "prefix: object key \"a//b\"");
  ExpectInvalid(OpenObjectStore("s3://bucket/../up", GoodOptions()).status(), "prefix");
}

TEST(OpenObjectStore, OpensS3StoresWithANormalisedUri) {
  auto store = OpenObjectStore("s3://ckpt-bucket/jobs/run-1/", GoodOptions());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->uri(), "s3://ckpt-bucket/jobs/run-1");
  auto bare = OpenObjectStore("s3://ckpt-bucket", GoodOptions());
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ((*bare)->uri(), "s3://ckpt-bucket");
}

TEST(OpenObjectStore, FileStoreRootThatIsAFileIsRefused) {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  Status s = OpenObjectStore(dir.path() + "/file").status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(dir.path() + "/file: Not a directory"), std::string::npos)
      << s.message();
}

TEST(S3Options, EachBadFieldIsNamed) {
  auto with = [](auto change) {
    S3Options o = GoodOptions();
    change(o);
    return ValidateS3Options(o);
  };
  EXPECT_TRUE(ValidateS3Options(GoodOptions()).ok());
  ExpectInvalid(with([](S3Options& o) { o.endpoint = ""; }), "endpoint \"\"");
  ExpectInvalid(with([](S3Options& o) { o.endpoint = "ftp://host"; }), "endpoint \"ftp://host\"");
  ExpectInvalid(with([](S3Options& o) { o.endpoint = "http://host:99999"; }), "bad port");
  ExpectInvalid(with([](S3Options& o) { o.endpoint = "http://host/path"; }), "a path after");
  ExpectInvalid(with([](S3Options& o) { o.path_style = false; }),
                "virtual-hosted addressing needs a DNS name");
  ExpectInvalid(with([](S3Options& o) { o.region = ""; }), "region \"\"");
  ExpectInvalid(with([](S3Options& o) { o.region = "EU West"; }), "region \"EU West\"");
  ExpectInvalid(with([](S3Options& o) { o.access_key_id = ""; }), "access_key_id is empty");
  ExpectInvalid(with([](S3Options& o) { o.secret_access_key = ""; }), "secret_access_key is empty");
  ExpectInvalid(with([](S3Options& o) { o.part_size = 1 << 20; }), "part_size 1048576");
  ExpectInvalid(with([](S3Options& o) { o.part_size = 6ull << 30; }), "part_size");
  ExpectInvalid(with([](S3Options& o) { o.parallel_parts = 0; }), "parallel_parts 0");
  ExpectInvalid(with([](S3Options& o) { o.max_attempts = 0; }), "max_attempts 0");
  ExpectInvalid(with([](S3Options& o) { o.retry_max_delay = std::chrono::milliseconds(1); }),
                "retry delays");
  ExpectInvalid(with([](S3Options& o) { o.list_max_keys = 1001; }), "list_max_keys 1001");
  // And through OpenObjectStore, with the URI in the message.
  S3Options no_key = GoodOptions();
  no_key.access_key_id = "";
  Status s = OpenObjectStore("s3://ckpt-bucket/x", no_key).status();
  ExpectInvalid(s, "store URI \"s3://ckpt-bucket/x\": s3 options: access_key_id is empty");
}

TEST(S3Options, MissingCaFileIsNamed) {
  S3Options o = GoodOptions();
  o.endpoint = "https://s3.example.com";
  o.ca_file = "/nonexistent/ca.pem";
  ExpectInvalid(S3Store::Open("ckpt-bucket", "", o).status(), "ca_file \"/nonexistent/ca.pem\"");
}

TEST(S3OptionsFromEnv, ReadsTheEnvironmentWithAwsDefaults) {
  auto o = S3OptionsFromEnv("", {{"AWS_ACCESS_KEY_ID", "AKID"},
                                 {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                 {"AWS_DEFAULT_REGION", "eu-west-1"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->access_key_id, "AKID");
  EXPECT_EQ(o->secret_access_key, "SECRET");
  EXPECT_EQ(o->session_token, "");
  EXPECT_EQ(o->region, "eu-west-1");
  EXPECT_EQ(o->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(o->path_style);  // AWS: virtual-hosted

  auto custom = S3OptionsFromEnv("", {{"AWS_ACCESS_KEY_ID", "AKID"},
                                      {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                      {"AWS_REGION", "us-west-2"},
                                      {"AWS_DEFAULT_REGION", "eu-west-1"},
                                      {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000"},
                                      {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001"},
                                      {"AWS_SESSION_TOKEN", "TOKEN"},
                                      {"AWS_CA_BUNDLE", "/etc/ca.pem"}});
  ASSERT_TRUE(custom.ok()) << custom.status().ToString();
  EXPECT_EQ(custom->region, "us-west-2");                // AWS_REGION wins
  EXPECT_EQ(custom->endpoint, "http://127.0.0.1:9001");  // the S3-specific one wins
  EXPECT_EQ(custom->session_token, "TOKEN");
  EXPECT_EQ(custom->ca_file, "/etc/ca.pem");
  EXPECT_TRUE(custom->path_style);  // a custom endpoint: path-style
}

TEST(S3OptionsFromEnv, SecretDirectoryWinsOverTheEnvironment) {
  TempDir dir;
  std::ofstream(dir.path() + "/AWS_ACCESS_KEY_ID") << "FROM_SECRET\n";
  std::ofstream(dir.path() + "/AWS_SECRET_ACCESS_KEY") << "SECRET_FROM_SECRET";
  std::ofstream(dir.path() + "/TIDAL_S3_ADDRESSING") << "path";
  auto o = S3OptionsFromEnv(
      dir.path(), {{"AWS_ACCESS_KEY_ID", "FROM_ENV"}, {"AWS_SESSION_TOKEN", "TOKEN_FROM_ENV"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->access_key_id, "FROM_SECRET");  // trailing newline dropped
  EXPECT_EQ(o->secret_access_key, "SECRET_FROM_SECRET");
  EXPECT_EQ(o->session_token, "TOKEN_FROM_ENV");  // not in the Secret: from the environment
  EXPECT_TRUE(o->path_style);
}

TEST(S3OptionsFromEnv, RefusesBadSettingsNamingThem) {
  const std::map<std::string, std::string> creds = {{"AWS_ACCESS_KEY_ID", "AKID"},
                                                    {"AWS_SECRET_ACCESS_KEY", "SECRET"}};
  auto with = [&](const std::string& name, const std::string& value) {
    auto env = creds;
    env[name] = value;
    return S3OptionsFromEnv("", env).status();
  };
  ExpectInvalid(with("TIDAL_S3_ADDRESSING", "vhost"),
                "TIDAL_S3_ADDRESSING is \"vhost\", expected path or virtual");
  ExpectInvalid(with("AWS_ENDPOINT_URL_S3", "127.0.0.1:9000"), "endpoint \"127.0.0.1:9000\"");
  ExpectInvalid(with("AWS_REGION", "Mars 1"), "region \"Mars 1\"");
  ExpectInvalid(S3OptionsFromEnv("", {}).status(), "AWS_ACCESS_KEY_ID");
  ExpectInvalid(S3OptionsFromEnv("", {{"AWS_ACCESS_KEY_ID", "AKID"}}).status(),
                "AWS_SECRET_ACCESS_KEY");
  ExpectInvalid(S3OptionsFromEnv("/nonexistent/secret", creds).status(),
                "Secret directory \"/nonexistent/secret\"");
}

}  // namespace
}  // namespace tidal::objstore
