// tests/integration/objstore/s3_server.h — a real S3-protocol server for the s3:// tests:
// moto's S3 (PyPI moto[server], in tools/venv by `make deps`) run by tools/s3_server.py as a
// child process on a free loopback port, with one bucket created at start and SigV4
// signatures verified: a request signed with another secret or an unknown key is refused.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tests/integration/process.h"

namespace tidal::testing {

class TempDir {
 public:
  TempDir();  // a unique directory under $TMPDIR
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class S3Server {
 public:
  struct Tls {
    std::string key_file, cert_file;  // PEM files
  };
  // Starts the server and waits (bounded) until it serves; on failure records a gtest failure
  // saying why (not installed, did not start) and returns null.
  static std::unique_ptr<S3Server> Start(const std::string& bucket,
                                         const std::optional<Tls>& tls = std::nullopt);
  ~S3Server();

  int port() const { return port_; }
  // "http://127.0.0.1:<port>" (https with Tls).
  const std::string& endpoint() const { return endpoint_; }
  // The one access key the server knows (an IAM user's, allowed s3:*), made at start.
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }

 private:
  S3Server() = default;
  std::unique_ptr<Process> process_;
  int port_ = 0;
  std::string endpoint_, access_key_, secret_key_;
};

}  // namespace tidal::testing
