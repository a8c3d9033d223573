// bench/checkpoint_io_bench.cc — checkpoint write and resharded load throughput on file://
// against `dd` moving the same bytes on the same disk, in the same run.
//
//   checkpoint_io_bench [--dir DIR] [--mib TOTAL] [--save-ranks W] [--load-ranks W2] [--rounds R]
//
// Write: W threads (the saving ranks) each build their shard of a checkpoint with the
// trainer's layout — every tensor cut into W contiguous pieces, XXH3 per 64 KiB chunk — and
// write it through Repository::WriteShard (temp file, fsync, rename, fsync of the directory);
// rank 0 then commits the manifest. Baseline: W `dd bs=4M conv=fsync` processes copying those
// shard files (the same bytes, read from the page cache) into the same directory.
// Load: W2 threads (the resuming ranks) each read their 1/W2 of every tensor with
// Repository::ReadTensorsInto (joined ranged reads, checksums verified) into memory they
// already hold. Baselines: W `dd bs=4M` reading the shard files whole into /dev/null (its 4 MiB
// buffer stays in the CPU cache), and W threads reading them whole into the same memory the load
// fills (4 MiB preads, no checksums, no resharding): what placing the bytes in memory costs here.
// Before each timed load the files are dropped from the page cache (posix_fadvise DONTNEED); an
// untimed read before both leaves any cache below the guest equally warm for each, and their order
// alternates by round. Prints one JSON line per round and a summary with the ratios (ours / dd; 1 =
// as fast).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/repository.h"
#include "worker/objstore/file_store.h"

namespace {

using namespace tidal::checkpoint;
namespace objstore = tidal::objstore;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir;
  int64_t mib = 512;
  int save_ranks = 4;
  int load_ranks = 3;
  int rounds = 3;
};

struct TensorSpec {
  std::string name;
  int64_t numel;
};

// A LoRA-like checkpoint: weights and two AdamW moments per tensor, tensors of 0.25–4 MiB.
std::vector<TensorSpec> Layout(int64_t total_bytes) {
  std::vector<TensorSpec> out;
  std::mt19937 rng(7);
  int64_t bytes = 0;
  for (int i = 0; bytes < total_bytes; ++i) {
    const int64_t numel = (1 << 16) << (rng() % 5);  // 256 KiB .. 4 MiB of fp32
    const std::string name =
        "model.layers." + std::to_string(i / 7) + ".m" + std::to_string(i % 7) + ".lora_A.weight";
    for (const char* prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."})
      out.push_back({prefix + name, numel});
    bytes += 3 * numel * 4;
  }
  return out;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void DropFromPageCache(const std::string& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void Check(const tidal::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "checkpoint_io_bench: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

// One save of `layout` by `ranks` threads at `step`; returns the committed manifest.
Manifest Save(Repository& repo, const std::vector<TensorSpec>& layout,
              const std::vector<std::string>& data, int ranks, int64_t step) {
  std::vector<tidal::StatusOr<BuiltShard>> shards(ranks, tidal::Aborted("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      std::vector<PieceData> pieces;
      for (size_t t = 0; t < layout.size(); ++t) {
        const int64_t lo = layout[t].numel * r / ranks, hi = layout[t].numel * (r + 1) / ranks;
        pieces.push_back({layout[t].name,
                          "F32",
                          {layout[t].numel},
                          lo,
                          std::string_view(data[t]).substr(lo * 4, (hi - lo) * 4)});
      }
      auto shard = BuildShard(r, ranks, pieces);
      if (shard.ok()) {
        tidal::Status written = repo.WriteShard(step, *shard);
        if (!written.ok()) shard = written;
      }
      shards[r] = std::move(shard);
    });
  for (auto& t : threads) t.join();
  std::vector<BuiltShard> built;
  for (auto& s : shards) {
    Check(s.status(), "write shard");
    built.push_back(std::move(*s));
  }
  Manifest header;
  header.step = step;
  header.world_size = ranks;
  auto manifest = AssembleManifest(header, built);
  Check(manifest.status(), "assemble manifest");
  Check(repo.Commit(*manifest), "commit");
  return *manifest;
}

// Every tensor read by `ranks` threads, each its 1/ranks into its own memory (`dest[r]`, in
// place before the clock starts, as a resuming rank's parameter and optimizer tensors are);
// returns the bytes read.
uint64_t Load(Repository& repo, const Manifest& manifest, std::vector<std::string>& dest) {
  const int ranks = static_cast<int>(dest.size());
  std::vector<uint64_t> bytes(ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      std::vector<Repository::TensorRead> reads;
      for (const TensorEntry& t : manifest.tensors) {
        const int64_t lo = t.numel() * r / ranks, hi = t.numel() * (r + 1) / ranks;
        reads.push_back({t.name, lo, hi - lo, dest[r].data() + bytes[r]});
        bytes[r] += static_cast<uint64_t>(hi - lo) * 4;
      }
      Check(repo.ReadTensorsInto(manifest, reads), "read tensors");
    });
  for (auto& t : threads) t.join();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

// The floor for putting the bytes in memory: one thread per shard file reading it whole with
// 4 MiB preads into `dest` (no checksums, no resharding); bytes per second.
double RawReadIntoMemory(const std::vector<std::string>& files, std::vector<std::string>& dest) {
  std::vector<std::thread> threads;
  std::vector<uint64_t> bytes(files.size(), 0);
  const auto start = Clock::now();
  for (size_t i = 0; i < files.size(); ++i)
    threads.emplace_back([&, i] {
      std::string& out = dest[i % dest.size()];
      int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      for (;;) {
        const uint64_t at = bytes[i] % (out.size() - (4 << 20));
        ssize_t n = ::pread(fd, out.data() + at, 4 << 20, static_cast<off_t>(bytes[i]));
        if (n <= 0) break;
        bytes[i] += static_cast<uint64_t>(n);
      }
      ::close(fd);
    });
  for (auto& t : threads) t.join();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total / Seconds(start);
}

// `dd` processes in parallel, one per (from, to) pair; wall seconds.
double RunDd(const std::vector<std::pair<std::string, std::string>>& copies, bool fsync) {
  std::string script;
  for (const auto& [from, to] : copies)
    script += "dd if='" + from + "' of='" + to + "' bs=4M" + (fsync ? " conv=fsync" : "") +
              " status=none & ";
  script += "wait";
  const auto start = Clock::now();
  if (std::system(script.c_str()) != 0) {
    std::fprintf(stderr, "checkpoint_io_bench: dd failed\n");
    std::exit(1);
  }
  return Seconds(start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.dir = (fs::temp_directory_path() / "tidal-ckpt-io-bench").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    auto number = [&](auto& out) {
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
      if (ec != std::errc() || end != value.data() + value.size() || out < 1) {
        std::fprintf(stderr, "%s: expected a positive integer, got \"%s\"\n", flag.c_str(),
                     value.c_str());
        std::exit(2);
      }
    };
    if (flag == "--dir")
      o.dir = value;
    else if (flag == "--mib")
      number(o.mib);
    else if (flag == "--save-ranks")
      number(o.save_ranks);
    else if (flag == "--load-ranks")
      number(o.load_ranks);
    else if (flag == "--rounds")
      number(o.rounds);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  fs::remove_all(o.dir);
  auto store = objstore::FileStore::Open(o.dir + "/ckpt");
  Check(store.status(), "open store");
  Repository repo(**store);
  const std::string dd_dir = o.dir + "/dd";
  fs::create_directories(dd_dir);

  const auto layout = Layout(o.mib << 20);
  std::vector<std::string> data;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  uint64_t total = 0;
  for (const TensorSpec& t : layout) {
    std::string bytes(t.numel * 4, '\0');
    for (int64_t i = 0; i < t.numel; ++i) {
      float v = normal(rng);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
    total += bytes.size();
    data.push_back(std::move(bytes));
  }

  std::vector<std::string> dest(o.load_ranks, std::string(total / o.load_ranks + (1 << 20), '\0'));
  std::vector<double> write_ours, write_dd, load_ours, load_dd, load_raw;
  for (int round = 0; round < o.rounds; ++round) {
    const int64_t step = round + 1;
    auto start = Clock::now();
    Manifest manifest = Save(repo, layout, data, o.save_ranks, step);
    write_ours.push_back(total / Seconds(start));

    std::vector<std::pair<std::string, std::string>> copies, reads;
    for (const ShardEntry& s : manifest.shards) {
      const std::string path = o.dir + "/ckpt/" + StepDirectory(step) + "/" + s.file;
      copies.emplace_back(path, dd_dir + "/" + s.file);
      reads.emplace_back(path, "/dev/null");
    }
    write_dd.push_back(total / RunDd(copies, /*fsync=*/true));

    uint64_t shard_bytes = 0;
    for (const ShardEntry& s : manifest.shards) shard_bytes += s.size;
    // A first, untimed read, so that both timed reads find the same caches below the guest
    // (a virtual disk's host caches what was just read); then each from a cold page cache,
    // in alternating order.
    RunDd(reads, /*fsync=*/false);
    auto ours = [&] {
      DropFromPageCache(o.dir);
      const auto begin = Clock::now();
      const uint64_t loaded = Load(repo, manifest, dest);
      load_ours.push_back(loaded / Seconds(begin));
    };
    auto theirs = [&] {
      DropFromPageCache(o.dir);
      load_dd.push_back(shard_bytes / RunDd(reads, /*fsync=*/false));
      std::vector<std::string> files;
      for (const auto& r : reads) files.push_back(r.first);
      DropFromPageCache(o.dir);
      load_raw.push_back(RawReadIntoMemory(files, dest));
    };
    if (round % 2 == 0) {
      ours();
      theirs();
    } else {
      theirs();
      ours();
    }

    std::printf("%s\n", nlohmann::json{{"round", round},
                                       {"write_MBps", write_ours.back() / 1e6},
                                       {"dd_write_MBps", write_dd.back() / 1e6},
                                       {"load_MBps", load_ours.back() / 1e6},
                                       {"dd_read_MBps", load_dd.back() / 1e6},
                                       {"raw_read_into_memory_MBps", load_raw.back() / 1e6}}
                            .dump()
                            .c_str());
    fs::remove_all(dd_dir);
    fs::create_directories(dd_dir);
    auto pruned = repo.Prune(1);  // keep the disk use to one checkpoint
    Check(pruned.status(), "prune");
  }
  std::printf("%s\n", nlohmann::json{{"bench", "checkpoint_io"},
                                     {"bytes", total},
                                     {"tensors", layout.size()},
                                     {"save_ranks", o.save_ranks},
                                     {"load_ranks", o.load_ranks},
                                     {"rounds", o.rounds},
                                     {"write_MBps", Median(write_ours) / 1e6},
                                     {"dd_write_MBps", Median(write_dd) / 1e6},
                                     {"write_ratio_vs_dd", Median(write_ours) / Median(write_dd)},
                                     {"resharded_load_MBps", Median(load_ours) / 1e6},
                                     {"dd_read_MBps", Median(load_dd) / 1e6},
                                     {"load_ratio_vs_dd", Median(load_ours) / Median(load_dd)},
                                     {"raw_read_into_memory_MBps", Median(load_raw) / 1e6},
                                     {"load_ratio_vs_raw_read_into_memory",
                                      Median(load_ours) / Median(load_raw)}}
                          .dump()
                          .c_str());
  fs::remove_all(o.dir);
  return 0;
}
