// checkpoint_compression_bench SHARD.safetensors... — what zstd would do to checkpoint shards of
// real LoRA weights, AdamW moments and gradient-compression residuals (bench/
// checkpoint_compression.sh writes them with tidal-train): each shard's tensor bytes cut into
// the checkpoint's 64 KiB chunks (the unit a resharded ranged read verifies, so the unit a
// compressed shard would have to frame), each chunk compressed on its own, as stored and with
// the fp32 bytes shuffled into planes (byte k of every value together), at zstd levels 1 and 3.
// Baselines in the same run: memcpy of the bytes, and writing them to a file beside the shards
// with fsync (what a file:// save costs). Prints one JSON line: per tensor kind and in all, the
// ratio, compress and decompress MB/s, and the link bandwidth below which compressing before
// the upload saves time.
#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kChunk = 64 << 10;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string KindOf(const std::string& name) {
  if (name.rfind("optimizer.residual.", 0) == 0) return "residual";
  if (name.rfind("optimizer.exp_avg_sq.", 0) == 0) return "exp_avg_sq";
  if (name.rfind("optimizer.exp_avg.", 0) == 0) return "exp_avg";
  return "weights";
}

std::string Shuffle(const std::string& bytes) {  // fp32: byte k of every value together
  std::string out(bytes.size(), '\0');
  const size_t n = bytes.size() / 4;
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < 4; ++k) out[k * n + i] = bytes[i * 4 + k];
  for (size_t i = n * 4; i < bytes.size(); ++i) out[i] = bytes[i];
  return out;
}

struct Result {
  size_t raw = 0, packed = 0;
  double compress_s = 0, decompress_s = 0;
};

// Each 64 KiB chunk its own frame, compressed then decompressed and checked.
Result Frames(const std::string& bytes, int level) {
  Result r;
  r.raw = bytes.size();
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::vector<std::string> frames;
  auto start = Clock::now();
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - at);
    std::string frame(ZSTD_compressBound(n), '\0');
    const size_t got =
        ZSTD_compressCCtx(c, frame.data(), frame.size(), bytes.data() + at, n, level);
    if (ZSTD_isError(got)) throw std::runtime_error(ZSTD_getErrorName(got));
    frame.resize(got);
    r.packed += got;
    frames.push_back(std::move(frame));
  }
  r.compress_s = Seconds(start);
  std::string back(bytes.size(), '\0');
  start = Clock::now();
  size_t at = 0;
  for (const std::string& frame : frames) {
    const size_t got =
        ZSTD_decompressDCtx(d, back.data() + at, back.size() - at, frame.data(), frame.size());
    if (ZSTD_isError(got)) throw std::runtime_error(ZSTD_getErrorName(got));
    at += got;
  }
  r.decompress_s = Seconds(start);
  if (back != bytes) throw std::runtime_error("zstd round trip changed the bytes");
  ZSTD_freeCCtx(c);
  ZSTD_freeDCtx(d);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: checkpoint_compression_bench SHARD.safetensors...\n");
    return 2;
  }
  std::map<std::string, std::string> kinds;  // kind → its bytes over every shard
  std::string all;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), {});
    if (file.size() < 8) {
      std::fprintf(stderr, "%s: not a safetensors file\n", argv[i]);
      return 1;
    }
    uint64_t header = 0;
    std::memcpy(&header, file.data(), 8);
    auto meta = nlohmann::json::parse(file.substr(8, header), nullptr, false);
    if (!meta.is_object()) {
      std::fprintf(stderr, "%s: unreadable header\n", argv[i]);
      return 1;
    }
    const std::string body = file.substr(8 + header);
    for (const auto& [name, t] : meta.items()) {
      if (name == "__metadata__") continue;
      const auto begin = t["data_offsets"][0].get<size_t>(),
                 end = t["data_offsets"][1].get<size_t>();
      kinds[KindOf(name)].append(body, begin, end - begin);
    }
    all += body;
    dir = std::string(argv[i]).substr(0, std::string(argv[i]).find_last_of('/') + 1);
  }
  // Baselines: memcpy, and a write with fsync beside the shards.
  std::string copy(all.size(), '\0');
  auto start = Clock::now();
  std::memcpy(copy.data(), all.data(), all.size());
  const double memcpy_s = Seconds(start);
  const std::string scratch = dir + ".compression-bench.tmp";
  start = Clock::now();
  int fd = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::write(fd, all.data(), all.size()) != static_cast<ssize_t>(all.size()) ||
      ::fsync(fd) != 0) {
    std::perror(scratch.c_str());
    return 1;
  }
  ::close(fd);
  const double write_s = Seconds(start);
  ::unlink(scratch.c_str());

  const double mb = 1e6;
  nlohmann::json out = {{"bench", "checkpoint_compression"},
                        {"bytes", all.size()},
                        {"chunk_bytes", kChunk},
                        {"memcpy_mb_s", all.size() / mb / memcpy_s},
                        {"file_write_fsync_mb_s", all.size() / mb / write_s}};
  for (int level : {1, 3}) {
    for (bool shuffled : {false, true}) {
      const std::string mode =
          std::string(shuffled ? "shuffled" : "as_stored") + "_level" + std::to_string(level);
      nlohmann::json entry;
      for (const auto& [kind, bytes] : kinds) {
        const Result r = Frames(shuffled ? Shuffle(bytes) : bytes, level);
        entry["ratio_by_kind"][kind] = static_cast<double>(r.raw) / r.packed;
      }
      const std::string input = shuffled ? Shuffle(all) : all;
      const Result r = Frames(input, level);
      const double saved = static_cast<double>(r.raw - r.packed);
      entry["ratio"] = static_cast<double>(r.raw) / r.packed;
      entry["compress_mb_s"] = r.raw / mb / r.compress_s;
      entry["decompress_mb_s"] = r.raw / mb / r.decompress_s;
      entry["compress_time_vs_file_write"] = r.compress_s / write_s;
      // Compressing first saves time on an upload of B bytes/s when saved / B > compress time.
      entry["pays_below_mb_s"] = saved / mb / r.compress_s;
      out["modes"][mode] = entry;
    }
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
