// The `tidal local` API server's request handling (local/apiserver.h) on arbitrary
// requests, authenticated, the way kubectl, helm and the operator reach it: routes and paths,
// query strings, JSON, YAML and Kubernetes protobuf bodies, patches of every type, through the
// CRD schemas to the durable store. Fields: method, target (path?query), Content-Type, body.
// Bad input is a 4xx Status; a 500 is a bug (the handler turns an exception into one), and so
// is a crash. The server and its store live for the whole run, so inputs build on the objects
// earlier ones created, as a client's requests do.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/http/pki.h"
#include "fuzz/fuzz_input.h"
#include "local/apiserver.h"

namespace {

using namespace tidal;

class RecordingWriter : public http::ResponseWriter {
 public:
  Status Send(http::Response response) override {
    status = response.status;
    body = std::move(response.body);
    return OkStatus();
  }
  Status StartStream(int s, http::Headers) override {
    status = s;
    return OkStatus();
  }
  Status WriteChunk(std::string_view data) override {
    body.append(data);
    return OkStatus();
  }
  bool ClientGone() override { return true; }  // a watch sends what it has and ends
  bool Stopping() const override { return false; }
  int status = 0;
  std::string body;
};

local::ApiServer& Server() {
  static local::ApiServer* server = [] {
    static std::string dir = [] {
      char path[] = "/tmp/tidal-apiserver-fuzz-XXXXXX";
      if (!::mkdtemp(path)) std::abort();
      return std::string(path);
    }();
    std::atexit([] { std::filesystem::remove_all(dir); });
    auto ca = http::GenerateCa("fuzz-ca", 1);
    if (!ca.ok()) std::abort();
    auto cert = http::IssueCertificate(*ca, {"localhost", {}, {"127.0.0.1"}, {"localhost"}});
    if (!cert.ok()) std::abort();
    local::ApiServerOptions options;
    options.data_dir = dir + "/data";
    options.token = "fuzz";
    options.cert_pem = cert->cert_pem;
    options.key_pem = cert->key_pem;
    auto started = local::ApiServer::Start(std::move(options));
    if (!started.ok()) {
      std::fprintf(stderr, "apiserver_fuzz: %s\n", started.status().message().c_str());
      std::abort();
    }
    return started->release();  // lives until exit, as the fuzzer's process does
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto fields = fuzz::Fields(data, size, 4);
  http::Request request;
  request.method = fields[0];
  request.target = fields[1];
  if (!http::ParseTarget(request).ok()) return 0;  // the HTTP server answers 400 before us
  request.headers.Set("authorization", "Bearer fuzz");
  if (!fields[2].empty()) request.headers.Set("content-type", fields[2]);
  request.body = fields[3];
  RecordingWriter writer;
  Server().Handle(request, writer);
  if (writer.status >= 500)
    fuzz::Violated("apiserver", request.method + " " + request.target + " answered " +
                                    std::to_string(writer.status) + ": " + writer.body);
  return 0;
}
