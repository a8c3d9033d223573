// The kubeconfig reader (kube/config.h) on arbitrary file contents: users point the
// operator and `tidal` at their own. Refusals are InvalidArgument naming the field, never a
// crash; an accepted config has a server to talk to.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz/fuzz_input.h"
#include "kube/config.h"

namespace {
// One file per process, rewritten for each input (in the process's own temporary directory).
const std::string& ConfigPath() {
  static const std::string path = [] {
    char dir[] = "/tmp/tidal-kubeconfig-fuzz-XXXXXX";
    if (!::mkdtemp(dir)) std::abort();
    static std::string cleanup_dir = dir;
    std::atexit([] {
      std::remove((cleanup_dir + "/config").c_str());
      ::rmdir(cleanup_dir.c_str());
    });
    return std::string(dir) + "/config";
  }();
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  {
    std::ofstream out(ConfigPath(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto connection = kube::LoadKubeconfig(ConfigPath());
  if (connection.ok() && connection->server.empty())
    fuzz::Violated("kubeconfig", "a config without a server is accepted");
  return 0;
}
