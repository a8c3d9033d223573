// tests/integration/objstore/fault_proxy.h — an HTTP proxy between the S3 store and the S3
// test server that records every request, checks each body against its Content-MD5 and
// x-amz-content-sha256 headers (the server checks neither), and lets a test answer chosen requests
// itself to inject the failures a real S3 produces: 503 SlowDown, 500 InternalError on one
// part, 403, an error inside a 200, or replace the answer of a request the server did carry
// out (a lost answer). Everything else goes to the server unchanged.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/http/client.h"
#include "common/http/server.h"

namespace tidal::testing {

class FaultProxy {
 public:
  // Returns a response to send instead of forwarding, or nullopt to forward. Called for each
  // request in arrival order (under a lock: rules may keep counters).
  using Rule = std::function<std::optional<http::Response>(const http::Request&)>;

  // Called with what the server answered a forwarded request: a response to send instead (the
  // server has acted, the client hears otherwise — a lost answer), or nullopt to pass it on.
  using AnswerRule =
      std::function<std::optional<http::Response>(const http::Request&, const http::Response&)>;

  // Forwards to http://127.0.0.1:<upstream_port>.
  static std::unique_ptr<FaultProxy> Start(int upstream_port, Rule rule = nullptr,
                                           AnswerRule answer_rule = nullptr);
  ~FaultProxy();

  std::string endpoint() const;
  // "METHOD target" of every request received, in order.
  std::vector<std::string> requests() const;
  // Requests whose body did not match its Content-MD5 or x-amz-content-sha256, or that were
  // not signed over them: one line each saying what was wrong.
  std::vector<std::string> checksum_errors() const;

  // An S3 error answer.
  static http::Response S3Error(int status, const std::string& code, const std::string& message);
  // What a rule returns to close the connection without an answer (a reset, a dropped
  // connection): the client sees the connection end where the answer should be.
  static http::Response HangUp() {
    http::Response r;
    r.status = 0;
    return r;
  }

 private:
  FaultProxy() = default;
  void Handle(const http::Request& request, http::ResponseWriter& writer);

  Rule rule_;
  AnswerRule answer_rule_;
  std::unique_ptr<http::Client> upstream_;
  std::unique_ptr<http::Server> server_;
  mutable std::mutex mu_;
  std::vector<std::string> requests_;
  std::vector<std::string> checksum_errors_;
};

}  // namespace tidal::testing
