// tests/integration/run_cache.h — a reference run made once per build, not once per test.
//
// ctest runs each GoogleTest case as a process of its own, so a suite's SetUpTestSuite runs for
// every case: a reference training run there was repeated by each of them. CachedRun makes it
// once into a directory of the build tree named by a key (what the run depends on: its inputs
// and the size and time of the binaries it runs) and hands that directory to every later
// case, across processes: a lock file serialises concurrent makers (ctest -j), and a `done`
// marker written last means a run that died half-way is made again, never used.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

namespace tidal::testing {

// Adds what identifies `path`'s contents cheaply (size and modification time) to `key`.
inline std::string WithFileIdentity(std::string key, const std::string& path) {
  std::error_code ec;
  key += "|" + path + ":" + std::to_string(std::filesystem::file_size(path, ec)) + ":" +
         std::to_string(std::filesystem::last_write_time(path, ec).time_since_epoch().count());
  return key;
}

// The directory <root>/<name>-<hash of key>, made by `make(dir)` (into an empty directory)
// unless an earlier call made it already. Empty when `make` returned false (the reason is
// the caller's to report; the half-made directory is removed).
inline std::string CachedRun(const std::string& root, const std::string& name,
                             const std::string& key,
                             const std::function<bool(const std::string& dir)>& make) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(root, ec);
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(key));
  const std::string dir = root + "/" + name + "-" + hash;
  const int lock = ::open((dir + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  std::string made = dir;
  if (!fs::exists(dir + "/done", ec)) {
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    if (make(dir)) {
      if (FILE* f = std::fopen((dir + "/done").c_str(), "w")) std::fclose(f);
    } else {
      fs::remove_all(dir, ec);
      made.clear();
    }
  }
  if (lock >= 0) ::close(lock);  // releases the flock
  return made;
}

}  // namespace tidal::testing
