// tests/integration/objstore/fault_proxy.cc
#include "tests/integration/objstore/fault_proxy.h"

#include <gtest/gtest.h>

#include "worker/objstore/s3_request.h"
#include "worker/objstore/sigv4.h"

namespace tidal::testing {
namespace {

// Multipart test objects are 16 MiB; parts of 5 MiB.
constexpr size_t kMaxBody = 64 * 1024 * 1024;

// Host is forwarded as the client sent it: the request's SigV4 signature covers it, and the
// server verifies signatures.
bool HopByHop(const std::string& name) {
  return name == "content-length" || name == "transfer-encoding" || name == "connection" ||
         name == "keep-alive";
}

}  // namespace

std::unique_ptr<FaultProxy> FaultProxy::Start(int upstream_port, Rule rule,
                                              AnswerRule answer_rule) {
  std::unique_ptr<FaultProxy> proxy(new FaultProxy());
  proxy->rule_ = std::move(rule);
  proxy->answer_rule_ = std::move(answer_rule);
  http::ClientOptions client_options;
  client_options.origin = {"http", "127.0.0.1", upstream_port};
  client_options.max_response_bytes = kMaxBody;
  auto client = http::Client::Create(client_options);
  if (!client.ok()) {
    ADD_FAILURE() << client.status().ToString();
    return nullptr;
  }
  proxy->upstream_ = std::move(*client);
  http::ServerOptions server_options;
  server_options.max_body_bytes = kMaxBody;
  FaultProxy* self = proxy.get();
  auto server = http::Server::Start(
      server_options, [self](const http::Request& request, http::ResponseWriter& writer) {
        self->Handle(request, writer);
      });
  if (!server.ok()) {
    ADD_FAILURE() << server.status().ToString();
    return nullptr;
  }
  proxy->server_ = std::move(*server);
  return proxy;
}

FaultProxy::~FaultProxy() {
  if (server_) server_->Stop();
}

std::string FaultProxy::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(server_->port());
}

std::vector<std::string> FaultProxy::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

std::vector<std::string> FaultProxy::checksum_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checksum_errors_;
}

http::Response FaultProxy::S3Error(int status, const std::string& code,
                                   const std::string& message) {
  http::Response response;
  response.status = status;
  response.headers.Set("Content-Type", "application/xml");
  response.body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code +
                  "</Code><Message>" + message + "</Message><RequestId>proxy</RequestId></Error>";
  return response;
}

void FaultProxy::Handle(const http::Request& request, http::ResponseWriter& writer) {
  const std::string line = request.method + " " + request.target;
  // What S3 itself would verify: the body against both checksums, and that both are signed.
  std::vector<std::string> errors;
  auto sha = request.headers.Get("x-amz-content-sha256");
  if (!sha || *sha != objstore::sigv4::Sha256Hex(request.body))
    errors.push_back(line + ": x-amz-content-sha256 does not match the body");
  auto md5 = request.headers.Get("content-md5");
  if (md5 && *md5 != objstore::s3::ContentMd5(request.body))
    errors.push_back(line + ": Content-MD5 does not match the body");
  if (!request.body.empty() && request.method == "PUT" && !md5)
    errors.push_back(line + ": an upload without Content-MD5");
  auto authorization = request.headers.Get("authorization").value_or("");
  if (authorization.find("x-amz-content-sha256") == std::string::npos ||
      (md5 && authorization.find("content-md5") == std::string::npos))
    errors.push_back(line + ": checksums not signed: " + authorization);
  std::optional<http::Response> injected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(line);
    checksum_errors_.insert(checksum_errors_.end(), errors.begin(), errors.end());
    if (rule_) injected = rule_(request);
  }
  if (injected) {
    if (injected->status != 0) writer.Send(*injected).ok();
    return;  // status 0: HangUp, returning unanswered closes the connection
  }
  http::Request forward;
  forward.method = request.method;
  forward.target = request.target;
  for (const auto& [name, value] : request.headers.entries())
    if (!HopByHop(name)) forward.headers.Add(name, value);
  forward.body = request.body;
  auto answer = upstream_->Send(std::move(forward));
  if (!answer.ok()) {
    writer.Send(S3Error(502, "ProxyError", answer.status().ToString())).ok();
    return;
  }
  http::Response response;
  response.status = answer->status;
  for (const auto& [name, value] : answer->headers.entries())
    if (!HopByHop(name)) response.headers.Add(name, value);
  response.body = std::move(answer->body);
  if (answer_rule_) {
    std::optional<http::Response> replaced;
    {
      std::lock_guard<std::mutex> lock(mu_);
      replaced = answer_rule_(request, response);
    }
    if (replaced) {
      if (replaced->status == 0) return;  // HangUp after the server acted
      response = std::move(*replaced);
    }
  }
  writer.Send(std::move(response)).ok();
}

}  // namespace tidal::testing
