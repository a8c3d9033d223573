// The HTTP server and client over real TLS on loopback: verification against the CA, host
// checks, keep-alive, body limits, streamed responses and cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/http/client.h"
#include "common/http/pki.h"
#include "common/http/server.h"

namespace tidal::http {
namespace {

using namespace std::chrono_literals;

struct Pki {
  KeyPair ca, server;
  Pki() {
    ca = *GenerateCa("test-ca", 1);
    CertificateRequest req;
    req.common_name = "server";
    req.ip_addresses = {"127.0.0.1"};
    server = *IssueCertificate(ca, req);
  }
};

std::unique_ptr<Server> StartEcho(const Pki& pki, size_t max_body = 1024) {
  ServerOptions options;
  options.tls = *TlsContext::Server(pki.server.cert_pem, pki.server.key_pem);
  options.max_body_bytes = max_body;
  auto server = Server::Start(options, [](const Request& req, ResponseWriter& w) {
    if (req.path == "/stream") {
      Headers h;
      h.Set("Content-Type", "application/json");
      if (!w.StartStream(200, h).ok()) return;
      for (int i = 0; i < 3; ++i) w.WriteChunk("{\"n\":" + std::to_string(i) + "}\n").ok();
      // Then wait until the client goes away or the server stops.
      while (!w.ClientGone() && !w.Stopping()) std::this_thread::sleep_for(10ms);
      return;
    }
    Response r;
    r.body = req.method + " " + req.path + " " + req.body;
    w.Send(r).ok();
  });
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return std::move(*server);
}

std::unique_ptr<Client> ClientFor(int port, const std::string& ca_pem) {
  ClientOptions options;
  options.origin = {"https", "127.0.0.1", port};
  options.tls = *TlsContext::Client(ca_pem);
  return std::move(*Client::Create(options));
}

TEST(HttpTls, ClientVerifiesServerAgainstCaAndReusesConnection) {
  Pki pki;
  auto server = StartEcho(pki);
  auto client = ClientFor(server->port(), pki.ca.cert_pem);
  for (int i = 0; i < 3; ++i) {
    Request req;
    req.method = "POST";
    req.target = "/echo";
    req.body = "hello" + std::to_string(i);
    auto resp = client->Send(req);
    ASSERT_TRUE(resp.ok()) << resp.status().ToString();
    EXPECT_EQ(resp->body, "POST /echo hello" + std::to_string(i));
  }
}

TEST(HttpTls, ClientRefusesServerSignedByAnotherCa) {
  Pki pki;
  auto server = StartEcho(pki);
  auto other = *GenerateCa("other-ca", 1);
  auto client = ClientFor(server->port(), other.cert_pem);
  Request req;
  req.method = "GET";
  req.target = "/";
  auto resp = client->Send(req);
  ASSERT_FALSE(resp.ok());
  EXPECT_NE(resp.status().message().find("certificate verification failed"), std::string::npos)
      << resp.status().message();
}

TEST(HttpTls, ClientRefusesCertificateForAnotherHost) {
  Pki pki;
  CertificateRequest req;
  req.common_name = "elsewhere";
  req.ip_addresses = {"10.1.2.3"};
  KeyPair wrong = *IssueCertificate(pki.ca, req);
  ServerOptions options;
  options.tls = *TlsContext::Server(wrong.cert_pem, wrong.key_pem);
  auto server =
      *Server::Start(options, [](const Request&, ResponseWriter& w) { w.Send(Response{}).ok(); });
  auto client = ClientFor(server->port(), pki.ca.cert_pem);
  Request r;
  r.method = "GET";
  r.target = "/";
  EXPECT_FALSE(client->Send(r).ok());
}

TEST(HttpTls, OversizeBodyGets413AndHandlerNeverRuns) {
  Pki pki;
  auto server = StartEcho(pki, /*max_body=*/100);
  auto client = ClientFor(server->port(), pki.ca.cert_pem);
  Request req;
  req.method = "PUT";
  req.target = "/big";
  req.body = std::string(101, 'x');
  auto resp = client->Send(req);
  ASSERT_TRUE(resp.ok()) << resp.status().ToString();
  EXPECT_EQ(resp->status, 413);
}

TEST(HttpTls, StreamDeliversLinesAndCancelWakesReader) {
  Pki pki;
  auto server = StartEcho(pki);
  auto client = ClientFor(server->port(), pki.ca.cert_pem);
  Request req;
  req.method = "GET";
  req.target = "/stream";
  auto stream = client->Stream(req, 10s);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  for (int i = 0; i < 3; ++i) {
    auto line = (*stream)->ReadLine();
    ASSERT_TRUE(line.ok() && line->has_value());
    EXPECT_EQ(**line, "{\"n\":" + std::to_string(i) + "}");
  }
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);
    (*stream)->Cancel();
  });
  auto blocked = (*stream)->ReadLine();
  canceller.join();
  EXPECT_FALSE(blocked.ok() && blocked->has_value());
}

TEST(HttpTls, StopEndsOpenStreams) {
  Pki pki;
  auto server = StartEcho(pki);
  auto client = ClientFor(server->port(), pki.ca.cert_pem);
  Request req;
  req.method = "GET";
  req.target = "/stream";
  auto stream = *client->Stream(req, 10s);
  server->Stop();  // must return although a stream is open
  for (int i = 0; i < 3; ++i) (void)stream->ReadLine();
  auto end = stream->ReadLine();
  EXPECT_FALSE(end.ok() && end->has_value());
}

}  // namespace
}  // namespace tidal::http
