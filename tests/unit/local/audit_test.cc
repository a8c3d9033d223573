// What the local API server's audit log makes of a request: the verb, group, resource,
// subresource and namespace kube-apiserver's RequestInfoFactory gives RBAC.
#include "local/audit.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace tidal::local {
namespace {

RequestInfo Info(const std::string& method, const std::string& target) {
  http::Request r;
  r.method = method;
  r.target = target;
  EXPECT_TRUE(http::ParseTarget(r).ok()) << target;
  return ParseRequestInfo(r);
}

std::string Summary(const RequestInfo& i) {
  return i.verb + " " + i.api_group + "/" + i.resource + (i.subresource.empty() ? "" : "/") +
         i.subresource + " ns=" + i.ns + " name=" + i.name;
}

TEST(RequestInfo, ReadsAreGetListOrWatchAsTheApiServerCallsThem) {
  EXPECT_EQ(Summary(Info("GET", "/api/v1/namespaces/a/pods/p")), "get /pods ns=a name=p");
  EXPECT_EQ(Summary(Info("GET", "/api/v1/pods?labelSelector=x%3Dy")), "list /pods ns= name=");
  EXPECT_EQ(Summary(Info("GET", "/api/v1/pods?watch=true&resourceVersion=5")),
            "watch /pods ns= name=");
  EXPECT_EQ(Summary(Info("GET", "/api/v1/watch/namespaces/a/pods")), "watch /pods ns=a name=");
  EXPECT_EQ(Summary(Info("GET", "/apis/tidal.dev/v1alpha1/namespaces/a/trainingjobs/j/scale")),
            "get tidal.dev/trainingjobs/scale ns=a name=j");
}

TEST(RequestInfo, WritesAreCreateUpdatePatchDeleteOrDeletecollection) {
  EXPECT_EQ(Summary(Info("POST", "/api/v1/namespaces/a/events")), "create /events ns=a name=");
  EXPECT_EQ(Summary(Info("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l")),
            "update coordination.k8s.io/leases ns=a name=l");
  EXPECT_EQ(Summary(Info("PATCH", "/apis/tidal.dev/v1alpha1/namespaces/a/trainingjobs/j/status")),
            "patch tidal.dev/trainingjobs/status ns=a name=j");
  EXPECT_EQ(Summary(Info("DELETE", "/api/v1/namespaces/a/pods/p")), "delete /pods ns=a name=p");
  EXPECT_EQ(Summary(Info("DELETE", "/api/v1/namespaces/a/pods")),
            "deletecollection /pods ns=a name=");
}

TEST(RequestInfo, ANamespaceIsItsOwnNamespaceAndDiscoveryIsNoResource) {
  EXPECT_EQ(Summary(Info("GET", "/api/v1/namespaces/a")), "get /namespaces ns=a name=a");
  EXPECT_EQ(Summary(Info("PUT", "/api/v1/namespaces/a/finalize")),
            "update /namespaces/finalize ns=a name=a");
  for (const char* target : {"/version", "/api", "/apis", "/apis/tidal.dev/v1alpha1", "/healthz"}) {
    RequestInfo i = Info("GET", target);
    EXPECT_FALSE(i.resource_request) << target;
    EXPECT_EQ(i.verb, "get") << target;
  }
}

TEST(AuditLog, WritesOneAuditEventPerRequestWithTheUserAgentAndObjectRef) {
  const std::string path = ::testing::TempDir() + "/audit-test.log";
  std::filesystem::remove(path);
  {
    auto log = AuditLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    http::Request r;
    r.method = "PATCH";
    r.target = "/apis/tidal.dev/v1alpha1/namespaces/a/trainingjobs/j/status";
    ASSERT_TRUE(http::ParseTarget(r).ok());
    r.headers.Set("User-Agent", "tidal-operator");
    (*log)->Record(r);
    r.method = "GET";
    r.target = "/version";
    ASSERT_TRUE(http::ParseTarget(r).ok());
    (*log)->Record(r);
  }
  std::ifstream in(path);
  std::string first, second, none;
  ASSERT_TRUE(std::getline(in, first) && std::getline(in, second));
  EXPECT_FALSE(std::getline(in, none));
  auto e = nlohmann::json::parse(first);
  EXPECT_EQ(e["apiVersion"], "audit.k8s.io/v1");
  EXPECT_EQ(e["kind"], "Event");
  EXPECT_EQ(e["verb"], "patch");
  EXPECT_EQ(e["userAgent"], "tidal-operator");
  EXPECT_EQ(e["objectRef"], (nlohmann::json{{"apiGroup", "tidal.dev"},
                                            {"apiVersion", "v1alpha1"},
                                            {"resource", "trainingjobs"},
                                            {"subresource", "status"},
                                            {"namespace", "a"},
                                            {"name", "j"}}));
  auto v = nlohmann::json::parse(second);
  EXPECT_EQ(v["requestURI"], "/version");
  EXPECT_FALSE(v.contains("objectRef"));
  EXPECT_NE(v["auditID"], e["auditID"]);
}

TEST(AuditLog, AnUnwritablePathIsAClearError) {
  auto log = AuditLog::Open("/nonexistent-dir/audit.log");
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("--audit-log"), std::string::npos);
}

}  // namespace
}  // namespace tidal::local
