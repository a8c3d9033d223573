// tests/integration/checkpoint/s3rver.cc
#include "tests/integration/checkpoint/s3rver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>

namespace tidal::testing {
namespace {

namespace fs = std::filesystem;
// node starts s3rver in about a second; this is the bound for a slow, loaded machine.
constexpr auto kStartTimeout = std::chrono::seconds(60);

}  // namespace

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "tidal-objstore-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern << " failed";
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests may leave read-only directories behind; make them writable to remove them.
  for (auto it = fs::recursive_directory_iterator(path_, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, ec);
  fs::remove_all(path_, ec);
}

std::unique_ptr<S3rver> S3rver::Start(const std::string& bucket, const std::optional<Tls>& tls) {
  if (!fs::exists(S3RVER_SCRIPT)) {
    ADD_FAILURE() << "s3rver is not installed at " << S3RVER_SCRIPT << ": run `make deps`";
    return nullptr;
  }
  std::unique_ptr<S3rver> server(new S3rver());
  // s3rver encrypts ListObjectsV2 continuation tokens with DES, which OpenSSL 3 (Node >= 17)
  // only offers through its legacy provider: without it every truncated listing is a 500.
  std::vector<std::string> argv = {NODE_BIN,
                                   "--openssl-legacy-provider",
                                   S3RVER_SCRIPT,
                                   "--directory",
                                   server->data_dir(),
                                   "--address",
                                   "127.0.0.1",
                                   "--port",
                                   "0",
                                   "--silent"};
  if (tls) {
    argv.insert(argv.end(), {"--key", tls->key_file, "--cert", tls->cert_file});
    server->tls_ = true;
  }
  // Last: s3rver reads the arguments after --configure-bucket's name as config files.
  argv.insert(argv.end(), {"--configure-bucket", bucket});
  server->process_ = std::make_unique<Process>(argv);
  const std::regex listening("S3rver listening on [^\\s]+:(\\d+)\\n");
  std::string port;
  bool started = server->process_->WaitForOutput(
      [&](const std::string& out) {
        std::smatch match;
        if (!std::regex_search(out, match, listening)) return false;
        port = match[1].str();
        return true;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(kStartTimeout));
  if (!started) {
    ProcessResult result = server->process_->Wait(std::chrono::seconds(5));
    ADD_FAILURE() << "s3rver did not start within " << kStartTimeout.count()
                  << " s; stdout: " << result.out << "\nstderr: " << result.err;
    return nullptr;
  }
  server->port_ = std::stoi(port);
  return server;
}

S3rver::~S3rver() {
  // Process's destructor kills (SIGKILL) and reaps the child; TempDir removes its files.
  process_.reset();
}

std::string S3rver::endpoint() const {
  return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_);
}

}  // namespace tidal::testing
