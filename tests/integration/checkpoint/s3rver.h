// tests/integration/checkpoint/s3rver.h — a real S3-protocol server for the s3:// tests:
// s3rver (npm, installed into tools/npm by tools/deps.sh) as a child process on a free
// loopback port, serving a fresh temporary directory, with one bucket created at start.
// s3rver does not check SigV4 signatures (it checks only that the access key is S3RVER), so
// the signer is checked against the AWS suite and botocore instead.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tests/integration/process.h"

namespace tidal::testing {

// The only credentials s3rver knows.
inline constexpr const char* kS3rverAccessKey = "S3RVER";
inline constexpr const char* kS3rverSecretKey = "S3RVER";

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

class S3rver {
 public:
  struct Tls {
    std::string key_file, cert_file;  // PEM files
  };
  // Starts s3rver and waits (bounded) until it listens; on failure records a gtest failure
  // saying why (not installed, did not start) and returns null.
  static std::unique_ptr<S3rver> Start(const std::string& bucket,
                                       const std::optional<Tls>& tls = std::nullopt);
  ~S3rver();

  int port() const { return port_; }
  // "http://127.0.0.1:<port>" (https with Tls).
  std::string endpoint() const;
  // Where s3rver keeps the bucket's files.
  std::string data_dir() const { return dir_.path() + "/data"; }

 private:
  S3rver() = default;
  TempDir dir_;
  std::unique_ptr<Process> process_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace tidal::testing
