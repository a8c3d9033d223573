// kubeconfig and in-cluster configuration, including each kind of bad file.
#include "kube/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/base64.h"

namespace tidal::kube {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tidal-config-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(ConfigTest, ReadsCurrentContextWithInlineDataAndFileReferences) {
  Write("ca.crt", "CA-PEM");
  std::string path = Write("config", R"(
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: c1
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: ca.crt}
users:
- name: u1
  user: {token: abc, client-certificate-data: )" +
                                         Base64Encode("CERT") + R"(, client-key-data: )" +
                                         Base64Encode("KEY") + R"(}
contexts:
- name: dev
  context: {cluster: c1, user: u1, namespace: ml}
)");
  auto c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "https://127.0.0.1:6443");
  EXPECT_EQ(c->ca_pem, "CA-PEM");
  EXPECT_EQ(c->token, "abc");
  EXPECT_EQ(c->client_cert_pem, "CERT");
  EXPECT_EQ(c->client_key_pem, "KEY");
  EXPECT_EQ(c->namespace_, "ml");
}

// Found by fuzz/kubeconfig_fuzz.cc: a key written with no value is null in YAML, and one of
// another type (a number, a list) used to end the process with an uncaught type_error.
TEST_F(ConfigTest, NullOrMistypedFieldsAreRefusedNamingTheFieldNotACrash) {
  const std::string base =
      "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
      "users: [{name: u, user: {token: t}}]\n";
  const std::pair<std::string, std::string> cases[] = {
      {"current-context:\ncontexts: [{name: x, context: {cluster: c}}]\n",
       "current-context is not set"},
      {"current-context: [x]\ncontexts: [{name: x, context: {cluster: c}}]\n",
       "current-context: expected a string, got array"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: 5, user: u}}]\n",
       "contexts[x].cluster: expected a string, got number"},
      {"current-context: x\ncontexts: [{name: x, context: {cluster: c, namespace: {a: 1}}}]\n",
       "contexts[x].namespace: expected a string, got object"},
      {"current-context: x\ncontexts: [{name: 7, context: {cluster: c}}]\n",
       "no context named \"x\""},
  };
  for (const auto& [text, want] : cases) {
    auto c = LoadKubeconfig(Write("config", base + text));
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << text << "\n"
                                                                  << c.status().message();
  }
  const std::pair<std::string, std::string> fields[] = {
      {"clusters: [{name: c, cluster: {server: 7}}]\n", "clusters[c].server: expected a string"},
      {"clusters: [{name: c, cluster: {server: 'http://a', insecure-skip-tls-verify: yes "
       "please}}]\n",
       "clusters[c].insecure-skip-tls-verify: expected true or false"},
      {"clusters: [{name: c, cluster: {server: 'http://a'}}]\nusers: [{name: u, user: {token: "
       "[1]}}]\n",
       "users[u].token: expected a string"},
  };
  for (const auto& [text, want] : fields) {
    auto c = LoadKubeconfig(
        Write("config", text + "current-context: x\ncontexts: [{name: x, context: {cluster: c, "
                               "user: u}}]\n"));
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << text << "\n"
                                                                  << c.status().message();
  }
  // Null is "not given": a null namespace is the default one.
  auto c = LoadKubeconfig(Write(
      "config", base + "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u, "
                       "namespace: null}}]\n"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->namespace_, "default");
}

TEST_F(ConfigTest, BadKubeconfigsNameWhatIsWrong) {
  auto message = [&](const std::string& text) {
    return LoadKubeconfig(Write("bad", text)).status().message();
  };
  EXPECT_NE(message("current-context: x\ncontexts: []\n").find("no context named \"x\""),
            std::string::npos);
  EXPECT_NE(message("current-context: x\ncontexts: [{name: x, context: {cluster: nope}}]\n")
                .find("cluster \"nope\""),
            std::string::npos);
  EXPECT_NE(
      message("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\nclusters: "
              "[{name: c, cluster: {server: 'https://h:1', insecure-skip-tls-verify: true}}]\n")
          .find("insecure-skip-tls-verify: not supported"),
      std::string::npos);
  EXPECT_NE(message("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\nclusters: "
                    "[{name: c, cluster: {server: 'https://h:1'}}]\n")
                .find("certificate-authority"),
            std::string::npos);
  EXPECT_NE(message("a: [\n").find("kubeconfig"), std::string::npos);
  EXPECT_EQ(LoadKubeconfig((dir_ / "missing").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(ConfigTest, InClusterUsesServiceAccountFilesAndServiceEnvironment) {
  InClusterPaths paths{Write("token", "tok\n"), Write("ca", "CA"), Write("ns", "jobs\n")};
  auto c = InClusterConfig(
      {{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}}, paths);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "https://10.0.0.1:443");
  EXPECT_EQ(c->token, "tok");
  EXPECT_EQ(c->namespace_, "jobs");
  EXPECT_FALSE(InClusterConfig({}, paths).ok());
}

}  // namespace
}  // namespace tidal::kube
