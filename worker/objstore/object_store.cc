// worker/objstore/object_store.cc — choosing a store from a URI, and the s3:// settings
// from a mounted Secret and the environment.
#include "worker/objstore/object_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "worker/objstore/file_store.h"
#include "worker/objstore/object_key.h"
#include "worker/objstore/s3_store.h"

namespace tidal::objstore {
namespace {

constexpr std::string_view kAccepted =
    "expected file:///abs/dir, file://relative/dir, /abs/dir or s3://bucket/prefix";

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// A value from the Secret directory (one file per key) when present there, else from `env`.
class Settings {
 public:
  Settings(std::string dir, const std::map<std::string, std::string>& env)
      : dir_(std::move(dir)), env_(env) {}

  StatusOr<std::string> Get(const std::string& name) const {
    if (!dir_.empty()) {
      const std::string path = dir_ + "/" + name;
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::ostringstream text;
        text << in.rdbuf();
        std::string value = text.str();
        // `echo key > file` and editors add a newline that is not part of the value.
        while (!value.empty() && (value.back() == '\n' || value.back() == '\r' ||
                                  value.back() == ' ' || value.back() == '\t'))
          value.pop_back();
        return value;
      }
      struct stat st;
      if (stat(path.c_str(), &st) == 0)
        return FailedPrecondition("s3 options: cannot read " + path + " from the Secret");
    }
    auto it = env_.find(name);
    return it == env_.end() ? std::string() : it->second;
  }
  // The first of `names` that is set.
  StatusOr<std::string> First(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      TIDAL_ASSIGN_OR_RETURN(std::string value, Get(name));
      if (!value.empty()) return value;
    }
    return std::string();
  }

 private:
  std::string dir_;
  const std::map<std::string, std::string>& env_;
};

StatusOr<std::string> AbsolutePath(const std::string& path, const std::string& uri) {
  if (path.empty())
    return InvalidArgument("store URI \"" + uri + "\": the path is empty; " +
                           std::string(kAccepted));
  if (path.front() == '/') return path;
  char cwd[4096];
  if (!getcwd(cwd, sizeof(cwd)))
    return Internal("store URI \"" + uri +
                    "\": cannot read the working directory: " + std::strerror(errno));
  return std::string(cwd) + "/" + path;
}

}  // namespace

StatusOr<S3Options> S3OptionsFromEnv(const std::string& secret_dir,
                                     const std::map<std::string, std::string>& env) {
  if (!secret_dir.empty()) {
    struct stat st;
    if (stat(secret_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return InvalidArgument("s3 options: the Secret directory \"" + secret_dir +
                             "\" does not exist or is not a directory");
  }
  Settings settings(secret_dir, env);
  S3Options options;
  TIDAL_ASSIGN_OR_RETURN(options.access_key_id, settings.Get("AWS_ACCESS_KEY_ID"));
  TIDAL_ASSIGN_OR_RETURN(options.secret_access_key, settings.Get("AWS_SECRET_ACCESS_KEY"));
  TIDAL_ASSIGN_OR_RETURN(options.session_token, settings.Get("AWS_SESSION_TOKEN"));
  TIDAL_ASSIGN_OR_RETURN(std::string region, settings.First({"AWS_REGION", "AWS_DEFAULT_REGION"}));
  if (!region.empty()) options.region = region;
  TIDAL_ASSIGN_OR_RETURN(options.endpoint,
                         settings.First({"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}));
  const bool aws = options.endpoint.empty();
  if (aws) options.endpoint = "https://s3." + options.region + ".amazonaws.com";
  TIDAL_ASSIGN_OR_RETURN(options.ca_file, settings.Get("AWS_CA_BUNDLE"));
  TIDAL_ASSIGN_OR_RETURN(std::string addressing, settings.Get("TIDAL_S3_ADDRESSING"));
  if (addressing.empty()) {
    // AWS prefers virtual-hosted buckets; S3-compatible servers (MinIO, Ceph, s3rver) are
    // usually reached by address, where only path-style works.
    options.path_style = !aws;
  } else if (addressing == "path" || addressing == "virtual") {
    options.path_style = addressing == "path";
  } else {
    return InvalidArgument("s3 options: TIDAL_S3_ADDRESSING is \"" + addressing +
                           "\", expected path or virtual");
  }
  TIDAL_RETURN_IF_ERROR(ValidateS3Options(options));
  return options;
}

StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& uri,
                                                       const S3Options& s3) {
  std::string path;
  if (StartsWith(uri, "s3://")) {
    std::string rest = uri.substr(5);
    size_t slash = rest.find('/');
    std::string bucket = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (bucket.empty())
      return InvalidArgument("store URI \"" + uri + "\": the bucket is empty; " +
                             std::string(kAccepted));
    if (Status valid = ValidateBucketName(bucket); !valid.ok())
      return valid.WithContext("store URI \"" + uri + "\"");
    if (!prefix.empty()) {
      if (Status valid = ValidateKey(prefix); !valid.ok())
        return InvalidArgument("store URI \"" + uri + "\": prefix: " + valid.message());
    }
    auto store = S3Store::Open(bucket, prefix, s3);
    if (!store.ok()) return store.status().WithContext("store URI \"" + uri + "\"");
    return std::unique_ptr<ObjectStore>(std::move(*store));
  }
  if (StartsWith(uri, "file://")) {
    TIDAL_ASSIGN_OR_RETURN(path, AbsolutePath(uri.substr(7), uri));
  } else if (StartsWith(uri, "/")) {
    path = uri;
  } else {
    return InvalidArgument("store URI \"" + uri + "\": " + std::string(kAccepted));
  }
  auto store = FileStore::Open(path);
  if (!store.ok()) return store.status().WithContext("store URI \"" + uri + "\"");
  return std::unique_ptr<ObjectStore>(std::move(*store));
}

}  // namespace tidal::objstore
