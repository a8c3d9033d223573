// tests/integration/objstore/s3_server.cc
#include "tests/integration/objstore/s3_server.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace tidal::testing {
namespace {

namespace fs = std::filesystem;
// The server starts in about two seconds (importing moto); this bounds a slow, loaded machine.
constexpr auto kStartTimeout = std::chrono::seconds(90);

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

std::unique_ptr<S3Server> S3Server::Start(const std::string& bucket,
                                          const std::optional<Tls>& tls) {
  if (!fs::exists(TIDAL_PYTHON)) {
    ADD_FAILURE() << "the project's Python (" << TIDAL_PYTHON << ") is missing: run `make deps`";
    return nullptr;
  }
  std::vector<std::string> argv = {
      TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tools/s3_server.py", "--bucket", bucket};
  if (tls) argv.insert(argv.end(), {"--tls-key", tls->key_file, "--tls-cert", tls->cert_file});
  std::unique_ptr<S3Server> server(new S3Server());
  server->process_ = std::make_unique<Process>(argv);
  nlohmann::json ready;
  bool started = server->process_->WaitForOutput(
      [&](const std::string& out) {
        auto eol = out.find('\n');
        if (eol == std::string::npos) return false;
        ready = nlohmann::json::parse(out.substr(0, eol), nullptr, /*allow_exceptions=*/false);
        return true;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(kStartTimeout));
  if (!started || !ready.is_object() || !ready.contains("port")) {
    ProcessResult result = server->process_->Wait(std::chrono::seconds(5));
    ADD_FAILURE() << "tools/s3_server.py did not start within " << kStartTimeout.count()
                  << " s; stdout: " << result.out << "\nstderr: " << result.err;
    return nullptr;
  }
  server->port_ = ready["port"].get<int>();
  server->endpoint_ = ready["endpoint"].get<std::string>();
  server->access_key_ = ready["access_key"].get<std::string>();
  server->secret_key_ = ready["secret_key"].get<std::string>();
  return server;
}

S3Server::~S3Server() {
  // Process's destructor kills (SIGKILL) and reaps the child.
  process_.reset();
}

}  // namespace tidal::testing
