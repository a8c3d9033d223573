// worker/objstore/file_store.cc
#include "worker/objstore/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>

#include "worker/objstore/object_key.h"

namespace tidal::objstore {
namespace {

// How many times Put re-creates a parent directory that a concurrent Delete removed (it prunes
// directories it emptied) between our mkdir and our open.
constexpr int kCreateAttempts = 3;
// The temporary file keeps this much of the key's last segment, so that its name stays under
// NAME_MAX (255) whatever the key's.
constexpr size_t kTempNameChars = 64;

// The code says whether retrying can help: a full disk may be freed by retention, a
// permission or a file where a directory should be cannot.
Status ErrnoStatus(int err, const std::string& what) {
  std::string message = "file store: " + what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return NotFound(message);
    case ENOSPC:
    case EDQUOT:
    case EINTR:
    case EAGAIN:
    case EMFILE:
    case ENFILE:
      return Unavailable(message);
    case EIO:
      return DataLoss(message);
    case ENAMETOOLONG:
    case EINVAL:
    case EFBIG:
      return InvalidArgument(message);
    case EACCES:
    case EPERM:
    case EROFS:
    case EISDIR:
    case ENOTDIR:
    case EEXIST:
      return FailedPrecondition(message);
    default:
      return Internal(message);
  }
}

std::string DirName(const std::string& path) { return path.substr(0, path.rfind('/')); }

std::string RandomSuffix() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   (static_cast<uint64_t>(getpid()) << 32));
  static const char* kHex = "0123456789abcdef";
  uint64_t bits = rng();
  std::string out;
  for (int i = 0; i < 16; ++i, bits >>= 4) out.push_back(kHex[bits & 15]);
  return out;
}

Status SyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "opening directory " + dir + " to sync it");
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, "syncing directory " + dir);
  return OkStatus();
}

// Creates `dir` and its missing parents (for Open), fsyncing each parent that gained an entry.
Status MakeDirectories(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return ErrnoStatus(ENOTDIR, dir);
    return OkStatus();
  }
  std::string parent = DirName(dir);
  if (!parent.empty()) TIDAL_RETURN_IF_ERROR(MakeDirectories(parent));
  if (mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return MakeDirectories(dir);  // created meanwhile by someone else
    return ErrnoStatus(errno, "creating directory " + dir);
  }
  return SyncDirectory(parent.empty() ? "/" : parent);
}

// 0, or the errno of the write that failed.
int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// Reads exactly the bytes from `offset` on into `spans`, in order: one preadv per up to
// IOV_MAX spans, resumed after short reads.
Status ReadScattered(int fd, uint64_t offset, const std::vector<ObjectStore::Span>& spans,
                     const std::string& path) {
  std::vector<iovec> iov;
  for (const auto& span : spans)
    if (span.length > 0) iov.push_back({span.dest, static_cast<size_t>(span.length)});
  size_t next = 0;
  uint64_t at = offset;
  while (next < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - next, IOV_MAX));
    ssize_t n = preadv(fd, &iov[next], count, static_cast<off_t>(at));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading " + path);
    }
    if (n == 0)
      return DataLoss("file store: " + path + " ended at " + std::to_string(at) +
                      " bytes while reading from offset " + std::to_string(offset));
    at += static_cast<uint64_t>(n);
    for (size_t left = static_cast<size_t>(n); left > 0;) {  // skip what was filled
      const size_t take = std::min(left, iov[next].iov_len);
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + take;
      iov[next].iov_len -= take;
      left -= take;
      if (iov[next].iov_len == 0) ++next;
    }
  }
  return OkStatus();
}

// Reads from `offset` to the end of the file.
StatusOr<std::string> ReadToEnd(int fd, uint64_t offset, const std::string& path) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof(buf), static_cast<off_t>(offset + out.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading " + path);
    }
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// Opens an object for reading: NotFound when the key is absent or names a directory.
StatusOr<int> OpenObject(const std::string& key, const std::string& path, struct stat& st) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return NotFound("file store: key \"" + key + "\" not found (" + path + ")");
    return ErrnoStatus(errno, "opening " + path);
  }
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, "stat of " + path);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return NotFound("file store: key \"" + key + "\" not found (" + path +
                    " is a directory, not an object)");
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return FailedPrecondition("file store: " + path + " is not a regular file");
  }
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& root) {
  if (root.empty() || root.front() != '/')
    return InvalidArgument("file store: root \"" + root + "\" must be an absolute path");
  std::string normal = std::filesystem::path(root).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (normal == "/")
    return InvalidArgument("file store: root \"" + root + "\" may not be the file system root");
  TIDAL_RETURN_IF_ERROR(MakeDirectories(normal));
  return std::unique_ptr<FileStore>(new FileStore(normal));
}

Status FileStore::MakeParents(const std::string& key) const {
  std::string dir = root_;
  size_t start = 0;
  for (size_t slash = key.find('/'); slash != std::string::npos; slash = key.find('/', start)) {
    std::string parent = dir;
    dir += "/" + key.substr(start, slash - start);
    start = slash + 1;
    if (mkdir(dir.c_str(), 0755) == 0) {
      TIDAL_RETURN_IF_ERROR(SyncDirectory(parent));
      continue;
    }
    if (errno != EEXIST) return ErrnoStatus(errno, "creating directory " + dir);
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat of " + dir);
    if (!S_ISDIR(st.st_mode))
      return ErrnoStatus(ENOTDIR, "writing key \"" + key + "\": " + dir + " is a file");
  }
  return OkStatus();
}

Status FileStore::Put(const std::string& key, std::string_view data) {
  return PutParts(key, {data});
}

Status FileStore::PutParts(const std::string& key, const std::vector<std::string_view>& parts) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  const std::string dir = DirName(path);
  const std::string name = path.substr(dir.size() + 1);
  std::string temp;
  int fd = -1;
  for (int attempt = 1; fd < 0; ++attempt) {
    TIDAL_RETURN_IF_ERROR(MakeParents(key));
    temp = dir + "/" + std::string(kTempPrefix) + name.substr(0, kTempNameChars) + "." +
           RandomSuffix();
    fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && !(errno == ENOENT && attempt < kCreateAttempts))
      return ErrnoStatus(errno, "creating " + temp + " to write " + path);
  }
  // From here on every failure removes the temporary file: the key keeps its old content.
  auto fail = [&](int err, const std::string& what) {
    if (fd >= 0) close(fd);
    unlink(temp.c_str());
    return ErrnoStatus(err, what);
  };
  for (std::string_view part : parts)
    if (int err = WriteAll(fd, part); err != 0) return fail(err, "writing " + path);
  if (fsync(fd) != 0) return fail(errno, "syncing " + path);
  int rc = close(fd);
  fd = -1;
  if (rc != 0) return fail(errno, "closing " + path);
  if (rename(temp.c_str(), path.c_str()) != 0)
    return fail(errno, "renaming " + temp + " to " + path);
  return SyncDirectory(dir);
}

StatusOr<std::string> FileStore::Get(const std::string& key) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  struct stat st;
  TIDAL_ASSIGN_OR_RETURN(int fd, OpenObject(key, path, st));
  auto data = ReadToEnd(fd, 0, path);
  close(fd);
  return data;
}

// Opens `key` for reading [offset, offset + length): InvalidArgument when that is past its end.
StatusOr<int> FileStore::OpenRange(const std::string& key, uint64_t offset, uint64_t length) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  struct stat st;
  TIDAL_ASSIGN_OR_RETURN(int fd, OpenObject(key, path, st));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size || length > size - offset) {
    close(fd);
    return InvalidArgument("file store: range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + length) + ") of key \"" + key +
                           "\" is past its end (size " + std::to_string(size) + ")");
  }
  return fd;
}

StatusOr<std::string> FileStore::GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) {
  TIDAL_ASSIGN_OR_RETURN(int fd, OpenRange(key, offset, length));
  std::string out(length, '\0');
  Status read = ReadScattered(fd, offset, {{out.data(), length}}, PathOf(key));
  close(fd);
  if (!read.ok()) return read;
  return out;
}

Status FileStore::GetRangeInto(const std::string& key, uint64_t offset, uint64_t length,
                               char* dest) {
  return GetRangeScatter(key, offset, {{dest, length}});
}

Status FileStore::GetRangeScatter(const std::string& key, uint64_t offset,
                                  const std::vector<Span>& spans) {
  uint64_t length = 0;
  for (const Span& span : spans) length += span.length;
  TIDAL_ASSIGN_OR_RETURN(int fd, OpenRange(key, offset, length));
  Status read = ReadScattered(fd, offset, spans, PathOf(key));
  close(fd);
  return read;
}

StatusOr<uint64_t> FileStore::Size(const std::string& key) {
  TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return NotFound("file store: key \"" + key + "\" not found (" + path + ")");
    return ErrnoStatus(errno, "stat of " + path);
  }
  if (!S_ISREG(st.st_mode))
    return NotFound("file store: key \"" + key + "\" not found (" + path +
                    " is not a regular file)");
  return static_cast<uint64_t>(st.st_size);
}

StatusOr<std::vector<ObjectInfo>> FileStore::List(const std::string& prefix) {
  TIDAL_RETURN_IF_ERROR(ValidatePrefix(prefix));
  std::vector<ObjectInfo> out;
  // Depth-first over the directories that can hold keys starting with `prefix`.
  std::vector<std::string> pending = {""};
  while (!pending.empty()) {
    std::string rel_dir = std::move(pending.back());
    pending.pop_back();
    std::string dir_path = rel_dir.empty() ? root_ : root_ + "/" + rel_dir;
    DIR* dir = opendir(dir_path.c_str());
    if (!dir) {
      // A subdirectory emptied and pruned by a concurrent Delete holds nothing to list.
      if (!rel_dir.empty() && (errno == ENOENT || errno == ENOTDIR)) continue;
      return ErrnoStatus(errno, "listing " + dir_path);
    }
    int dir_fd = dirfd(dir);
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name == "." || name == ".." || name.compare(0, kTempPrefix.size(), kTempPrefix) == 0)
        continue;
      std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
      struct stat st;
      if (fstatat(dir_fd, entry->d_name, &st, 0) != 0) {
        if (errno == ENOENT) continue;  // deleted meanwhile
        int err = errno;
        closedir(dir);
        return ErrnoStatus(err, "stat of " + dir_path + "/" + name);
      }
      if (S_ISDIR(st.st_mode)) {
        // Symbolic links to directories are not followed (no cycles, no escaping the root).
        if (entry->d_type == DT_LNK) continue;
        std::string as_dir = rel + "/";
        if (as_dir.compare(0, prefix.size(), prefix) == 0 ||
            prefix.compare(0, as_dir.size(), as_dir) == 0)
          pending.push_back(rel);
      } else if (S_ISREG(st.st_mode) && rel.compare(0, prefix.size(), prefix) == 0) {
        out.push_back({rel, static_cast<uint64_t>(st.st_size)});
      }
    }
    closedir(dir);
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Status FileStore::Delete(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) TIDAL_RETURN_IF_ERROR(ValidateKey(key));
  std::set<std::string> touched;  // directories that lost an entry
  for (const std::string& key : keys) {
    std::string path = PathOf(key);
    if (unlink(path.c_str()) == 0) {
      touched.insert(DirName(path));
      continue;
    }
    // Absent, or a directory (which is not an object): nothing to delete.
    if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) continue;
    return ErrnoStatus(errno, "deleting " + path);
  }
  // Prune directories left empty (S3 has no empty "directories" either), deepest first, and
  // make the removals durable.
  std::set<std::string> to_sync;
  for (auto it = touched.rbegin(); it != touched.rend(); ++it) {
    std::string dir = *it;
    while (dir.size() > root_.size() && rmdir(dir.c_str()) == 0) dir = DirName(dir);
    to_sync.insert(dir);
  }
  for (const std::string& dir : to_sync) {
    Status synced = SyncDirectory(dir);
    if (!synced.ok() && synced.code() != StatusCode::kNotFound) return synced;
  }
  return OkStatus();
}

}  // namespace tidal::objstore
