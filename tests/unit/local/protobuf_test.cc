// The protobuf bodies real clients send (captured from kubectl and helm, see
// tests/fixtures/local/protobuf/README.md) decode to the JSON the API would have received.
#include "local/protobuf.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/base64.h"

namespace tidal::local {
namespace {

std::string Fixture(const std::string& name) {
  std::ifstream in(std::string(TIDAL_SOURCE_DIR) + "/tests/fixtures/local/protobuf/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

TEST(KubeProtobufTest, KubectlCreateSecretDecodesWithBinaryDataAndType) {
  auto secret = DecodeKubeProtobuf(Fixture("secret.bin"));
  ASSERT_TRUE(secret.ok()) << secret.status().message();
  EXPECT_EQ((*secret)["apiVersion"], "v1");
  EXPECT_EQ((*secret)["kind"], "Secret");
  EXPECT_EQ((*secret)["metadata"], nlohmann::json({{"name", "s5"}}));  // zero values omitted
  EXPECT_EQ((*secret)["type"], "tidal.dev/s3");
  EXPECT_EQ((*secret)["data"]["AWS_ACCESS_KEY_ID"], Base64Encode("AKIDEXAMPLE"));
  EXPECT_EQ((*secret)["data"]["bin"], Base64Encode("\x01\xff"));
}

TEST(KubeProtobufTest, KubectlCreateConfigMapDecodesDataAndBinaryData) {
  auto cm = DecodeKubeProtobuf(Fixture("configmap.bin"));
  ASSERT_TRUE(cm.ok()) << cm.status().message();
  EXPECT_EQ((*cm)["metadata"]["name"], "cm5");
  EXPECT_EQ((*cm)["data"], nlohmann::json({{"mode", "fast"}}));
  EXPECT_EQ((*cm)["binaryData"]["blob"], Base64Encode(std::string("\x00\x01\xfe", 3)));
}

TEST(KubeProtobufTest, KubectlCreateNamespaceAndHelmDeleteOptionsDecode) {
  auto ns = DecodeKubeProtobuf(Fixture("namespace.bin"));
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  EXPECT_EQ((*ns)["kind"], "Namespace");
  EXPECT_EQ((*ns)["metadata"]["name"], "team-b");
  auto options = DecodeKubeProtobuf(Fixture("deleteoptions.bin"));
  ASSERT_TRUE(options.ok()) << options.status().message();
  EXPECT_EQ((*options)["kind"], "DeleteOptions");
}

// Protobuf by hand: a length-delimited field, and a varint one.
std::string Bytes(int field, const std::string& value) {
  std::string out(1, static_cast<char>(field << 3 | 2));
  out += static_cast<char>(value.size());  // short values: one-byte lengths
  return out + value;
}
std::string Varint(int field, uint8_t value) {
  return std::string{static_cast<char>(field << 3), static_cast<char>(value)};
}

// kubectl drain POSTs its Eviction as JSON; clients on client-go's protobuf content type
// (cluster autoscalers, node-termination handlers) send policy/v1 Eviction { metadata = 1,
// deleteOptions = 2 }.
TEST(KubeProtobufTest, AProtobufEvictionDecodesWithItsDeleteOptions) {
  const std::string eviction = Bytes(1, Bytes(1, "drained") + Bytes(3, "default")) +
                               Bytes(2, Varint(1, 10) + Bytes(2, Bytes(1, "uid-1")));
  const std::string body = std::string("k8s\0", 4) +
                           Bytes(1, Bytes(1, "policy/v1") + Bytes(2, "Eviction")) +
                           Bytes(2, eviction);
  auto decoded = DecodeKubeProtobuf(body);
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_EQ(*decoded, nlohmann::json::parse(R"({
      "apiVersion": "policy/v1", "kind": "Eviction",
      "metadata": {"name": "drained", "namespace": "default"},
      "deleteOptions": {"gracePeriodSeconds": 10, "preconditions": {"uid": "uid-1"}}})"));
}

TEST(KubeProtobufTest, MalformedBodiesAndUnknownKindsAreRefusedNotCrashed) {
  std::string secret = Fixture("secret.bin");
  // Every truncation is either a clean error or (at a field boundary) a shorter object.
  for (size_t n = 0; n < secret.size(); ++n) DecodeKubeProtobuf(secret.substr(0, n)).ok();
  auto no_magic = DecodeKubeProtobuf(secret.substr(4));
  EXPECT_EQ(no_magic.status().code(), StatusCode::kInvalidArgument);
  auto truncated = DecodeKubeProtobuf(secret.substr(0, secret.size() - 3));
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);
  std::string pod = std::string("k8s\0", 4) + "\x0a\x09\x0a\x02v1\x12\x03Pod";
  auto unknown = DecodeKubeProtobuf(pod);
  EXPECT_EQ(unknown.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.status().message().find("v1 Pod"), std::string::npos);
  std::string bad_wire = std::string("k8s\0", 4) + "\x0f";
  EXPECT_FALSE(DecodeKubeProtobuf(bad_wire).ok());
}

}  // namespace
}  // namespace tidal::local
