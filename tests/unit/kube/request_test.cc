// Pure request builders: the method, path, query and body kube-apiserver expects, checked
// without a server (as kube-rs tests its request builders).
#include "kube/request.h"

#include <gtest/gtest.h>

#include "kube/client.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

TEST(RequestTest, CoreAndGroupResourcesGetTheirApiPrefixes) {
  EXPECT_EQ(GetRequest(Resource::Pods(), "ml", "w-0")->path, "/api/v1/namespaces/ml/pods/w-0");
  EXPECT_EQ(GetRequest(Resource::TrainingJobs(), "ml", "llama")->path,
            "/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs/llama");
  EXPECT_EQ(GetRequest(Resource::Nodes(), "", "gpu-1")->path, "/api/v1/nodes/gpu-1");
}

TEST(RequestTest, StatusAndScaleSubresourcesAppendToTheObjectPath) {
  auto status =
      MergePatchRequest(Resource::TrainingJobs(), "ml", "j", {{"status", {{"step", 3}}}}, "status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->method, "PATCH");
  EXPECT_EQ(status->path, "/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs/j/status");
  EXPECT_EQ(status->content_type, "application/merge-patch+json");
  EXPECT_EQ(json::parse(*status->body), (json{{"status", {{"step", 3}}}}));
  EXPECT_EQ(GetRequest(Resource::TrainingJobs(), "ml", "j", "scale")->path,
            "/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs/j/scale");
  EXPECT_FALSE(GetRequest(Resource::TrainingJobs(), "ml", "j", "logs").ok());
}

TEST(RequestTest, ListEncodesSelectorsAndPagination) {
  ListOptions o;
  o.label_selector = "tidal.dev/job=llama,tidal.dev/role in (worker)";
  o.field_selector = "status.phase=Running";
  o.limit = 500;
  o.continue_token = "abc=";
  auto req = ListRequest(Resource::Pods(), "ml", o);
  ASSERT_TRUE(req.ok());
  EXPECT_EQ(
      req->Target(),
      "/api/v1/namespaces/ml/pods?labelSelector=tidal.dev%2Fjob%3Dllama%2Ctidal.dev%2Frole%20in%20"
      "%28worker%29&fieldSelector=status.phase%3DRunning&limit=500&continue=abc%3D");
  EXPECT_EQ(ListRequest(Resource::Pods(), "", {})->path, "/api/v1/pods");  // all namespaces
  ListOptions bad;
  bad.limit = 0;
  EXPECT_FALSE(ListRequest(Resource::Pods(), "ml", bad).ok());
}

TEST(RequestTest, WatchResumesFromAResourceVersionWithBookmarks) {
  WatchOptions o;
  o.resource_version = "1234";
  o.timeout_seconds = 290;
  auto req = WatchRequest(Resource::TrainingJobs(), "ml", o);
  ASSERT_TRUE(req.ok());
  EXPECT_EQ(req->Target(),
            "/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs?watch=true&resourceVersion=1234"
            "&allowWatchBookmarks=true&timeoutSeconds=290");
}

TEST(RequestTest, CreateAndReplaceCarryTheObject) {
  json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", "w-0"}}}};
  auto create = CreateRequest(Resource::Pods(), "ml", pod);
  ASSERT_TRUE(create.ok());
  EXPECT_EQ(create->method, "POST");
  EXPECT_EQ(create->path, "/api/v1/namespaces/ml/pods");
  EXPECT_EQ(json::parse(*create->body), pod);
  auto replace = ReplaceRequest(Resource::Pods(), "ml", "w-0", pod);
  ASSERT_TRUE(replace.ok());
  EXPECT_EQ(replace->method, "PUT");
  EXPECT_EQ(replace->path, "/api/v1/namespaces/ml/pods/w-0");
  EXPECT_FALSE(CreateRequest(Resource::Pods(), "ml", json::array()).ok());
}

TEST(RequestTest, DeleteSendsPropagationAndPreconditions) {
  DeleteOptions o;
  o.propagation_policy = "Foreground";
  o.precondition_uid = "u-1";
  o.precondition_resource_version = "42";
  auto req = DeleteRequest(Resource::TrainingJobs(), "ml", "j", o);
  ASSERT_TRUE(req.ok());
  EXPECT_EQ(req->method, "DELETE");
  EXPECT_EQ(json::parse(*req->body),
            (json{{"apiVersion", "v1"},
                  {"kind", "DeleteOptions"},
                  {"propagationPolicy", "Foreground"},
                  {"preconditions", {{"uid", "u-1"}, {"resourceVersion", "42"}}}}));
  o.propagation_policy = "Cascade";
  EXPECT_NE(
      DeleteRequest(Resource::Pods(), "ml", "w", o).status().message().find("propagationPolicy"),
      std::string::npos);
}

TEST(RequestTest, BadNamesAndScopesAreRefusedWithTheField) {
  EXPECT_NE(GetRequest(Resource::Pods(), "ml", "Worker_0").status().message().find("metadata.name"),
            std::string::npos);
  EXPECT_NE(GetRequest(Resource::Pods(), "", "w").status().message().find("namespace: required"),
            std::string::npos);
  EXPECT_NE(GetRequest(Resource::Nodes(), "ml", "n").status().message().find("cluster-scoped"),
            std::string::npos);
  EXPECT_FALSE(GetRequest(Resource::Pods(), "ml", "-w").ok());
  EXPECT_FALSE(GetRequest(Resource::Pods(), "ml", std::string(254, 'a')).ok());
  EXPECT_TRUE(ValidateObjectName("deepseek-7b-lora.v2").ok());
}

// Callers tell errors apart by kind, never by their text: a create that finds the object
// (409 AlreadyExists) is not a lost compare-and-swap (409 Conflict), and a 410 means relist.
TEST(StatusFromResponseTest, EachApiServerAnswerMapsToAKindAndKeepsTheServersMessage) {
  auto answer = [](int code, const std::string& reason) {
    return StatusFromResponse({code,
                               {{"kind", "Status"},
                                {"code", code},
                                {"reason", reason},
                                {"message", "the server's words"}}});
  };
  EXPECT_EQ(answer(409, "AlreadyExists").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(answer(409, "Conflict").code(), StatusCode::kAborted);
  EXPECT_EQ(answer(410, "Expired").code(), StatusCode::kExpired);
  EXPECT_EQ(answer(410, "Gone").code(), StatusCode::kExpired);
  EXPECT_EQ(answer(404, "NotFound").code(), StatusCode::kNotFound);
  EXPECT_EQ(answer(401, "Unauthorized").code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(answer(403, "Forbidden").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(answer(422, "Invalid").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(answer(400, "BadRequest").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(answer(429, "TooManyRequests").code(), StatusCode::kUnavailable);
  EXPECT_EQ(answer(503, "ServiceUnavailable").code(), StatusCode::kUnavailable);
  EXPECT_EQ(answer(418, "").code(), StatusCode::kInternal);
  EXPECT_EQ(answer(409, "AlreadyExists").message(), "the server's words");
  EXPECT_TRUE(answer(409, "Conflict").retryable());
  EXPECT_FALSE(answer(409, "AlreadyExists").retryable());
  EXPECT_FALSE(answer(410, "Expired").retryable());
  // A body that is no Status (a proxy's HTML page): the HTTP code says what it can.
  EXPECT_EQ(StatusFromResponse({409, "<html>"}).code(), StatusCode::kAborted);
  EXPECT_EQ(StatusFromResponse({409, "<html>"}).message(), "HTTP 409");
}

}  // namespace
}  // namespace tidal::kube
