// local/cluster.cc
#include "local/cluster.h"

#include <openssl/rand.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base64.h"
#include "common/http/pki.h"
#include "common/log.h"

namespace tidal::local {
namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Written whole to a temporary file, then renamed: a crash never leaves half a key.
Status WriteFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Unavailable("cannot write " + tmp);
    out << data;
    out.close();
    if (!out) return Unavailable("cannot write " + tmp);
  }
  chmod(tmp.c_str(), mode);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Unavailable("cannot write " + path + ": " + ec.message());
  return OkStatus();
}

std::string RandomToken() {
  unsigned char bytes[24];
  RAND_bytes(bytes, sizeof(bytes));
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

struct Credentials {
  http::KeyPair ca, server;
  std::string token;
};

StatusOr<Credentials> LoadOrCreateCredentials(const std::string& dir) {
  Credentials c;
  auto ca_cert = ReadFile(dir + "/ca.crt");
  auto ca_key = ReadFile(dir + "/ca.key");
  auto cert = ReadFile(dir + "/server.crt");
  auto key = ReadFile(dir + "/server.key");
  auto token = ReadFile(dir + "/token");
  if (ca_cert.ok() && ca_key.ok() && cert.ok() && key.ok() && token.ok()) {
    c.ca = {*ca_cert, *ca_key};
    c.server = {*cert, *key};
    c.token = *token;
    while (!c.token.empty() && std::isspace(static_cast<unsigned char>(c.token.back())))
      c.token.pop_back();
    return c;
  }
  TIDAL_ASSIGN_OR_RETURN(c.ca, http::GenerateCa("tidal-local-ca", 3650));
  http::CertificateRequest request;
  request.common_name = "tidal-local-apiserver";
  request.ip_addresses = {"127.0.0.1"};
  request.dns_names = {"localhost", "kubernetes", "kubernetes.default"};
  request.valid_days = 3650;
  TIDAL_ASSIGN_OR_RETURN(c.server, http::IssueCertificate(c.ca, request));
  c.token = RandomToken();
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/ca.key", c.ca.key_pem, 0600));
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/ca.crt", c.ca.cert_pem, 0644));
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/server.key", c.server.key_pem, 0600));
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/server.crt", c.server.cert_pem, 0644));
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(dir + "/token", c.token + "\n", 0600));
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(ClusterOptions options) {
  if (options.nodes < 1) return InvalidArgument("--nodes: expected at least 1");
  if (options.gpus_per_node < 0) return InvalidArgument("--gpus: expected 0 or more");
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) return InvalidArgument("--data: cannot create " + options.data_dir + ": " + ec.message());
  options.data_dir = std::filesystem::absolute(options.data_dir).string();
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options));
  TIDAL_ASSIGN_OR_RETURN(Credentials creds, LoadOrCreateCredentials(options.data_dir));

  int port = options.port;
  if (port < 0) {
    auto previous = ReadFile(options.data_dir + "/port");
    port = previous.ok() ? std::atoi(previous->c_str()) : 0;
  }
  ApiServerOptions api;
  api.data_dir = options.data_dir;
  api.token = creds.token;
  api.cert_pem = creds.server.cert_pem;
  api.key_pem = creds.server.key_pem;
  api.port = port;
  api.history_size = options.history_size;
  api.bookmark_interval = options.bookmark_interval;
  api.audit_log_path = options.audit_log_path;
  api.admit_create = options.admit_create;
  api.admit_update = options.admit_update;
  std::string data_dir = options.data_dir;
  api.log_path = [data_dir](const std::string& ns, const std::string& pod, const std::string& c) {
    return ProcessKubelet::LogPath(data_dir, ns, pod, c);
  };
  TIDAL_ASSIGN_OR_RETURN(ImageTable images, DefaultImages(options.images));
  TIDAL_ASSIGN_OR_RETURN(cluster->api_, ApiServer::Start(api));
  TIDAL_RETURN_IF_ERROR(WriteFileAtomically(options.data_dir + "/port",
                                            std::to_string(cluster->port()) + "\n", 0644));

  nlohmann::json kubeconfig = {
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"clusters",
       {{{"name", "tidal-local"},
         {"cluster",
          {{"server", "https://127.0.0.1:" + std::to_string(cluster->port())},
           {"certificate-authority-data", Base64Encode(creds.ca.cert_pem)}}}}}},
      {"users", {{{"name", "tidal-admin"}, {"user", {{"token", creds.token}}}}}},
      {"contexts",
       {{{"name", "tidal-local"},
         {"context",
          {{"cluster", "tidal-local"}, {"user", "tidal-admin"}, {"namespace", "default"}}}}}},
      {"current-context", "tidal-local"}};
  TIDAL_RETURN_IF_ERROR(
      WriteFileAtomically(cluster->kubeconfig_path(), kubeconfig.dump(2) + "\n", 0600));
  TIDAL_RETURN_IF_ERROR(cluster->RegisterNodes());
  KubeletOptions kubelet;
  kubelet.data_dir = options.data_dir;
  kubelet.images = std::move(images);
  kubelet.api_port = cluster->port();
  kubelet.initial_backoff = options.crash_backoff;
  kubelet.keep_logs = options.keep_logs;
  for (int i = 0; i < options.nodes; ++i) {
    std::string name = "tidal-node-" + std::to_string(i);
    kubelet.nodes.push_back({name,
                             {{"kubernetes.io/hostname", name}, {"tidal.dev/local", "true"}},
                             options.gpus_per_node});
  }
  cluster->kubelet_ = std::make_unique<ProcessKubelet>(*cluster->api_, std::move(kubelet));
  cluster->kubelet_->Start();
  return cluster;
}

StatusOr<ImageTable> DefaultImages(const std::vector<std::string>& extra) {
  ImageTable images;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto bin = self.parent_path();
    // Installed side by side, or the build tree (build/operator/tidal, build/worker/…).
    for (const char* exe : {"tidal-worker", "tidal-train"}) {
      for (const auto& dir : {bin, bin.parent_path() / "worker"}) {
        auto path = dir / exe;
        if (!std::filesystem::exists(path)) continue;
        images.Set(std::string("ghcr.io/tidal-dev/") + exe, path.string());
        images.Set(exe, path.string());  // the CRD's default worker image, tidal-worker:latest
        break;
      }
    }
    images.Set("ghcr.io/tidal-dev/tidal", self.string());
  }
  for (const std::string& entry : extra) TIDAL_RETURN_IF_ERROR(images.Add(entry));
  return images;
}

Status LocalCluster::RegisterNodes() {
  auto nodes = api_->registry().Find("", "v1", "nodes");
  for (int i = 0; i < options_.nodes; ++i) {
    std::string name = "tidal-node-" + std::to_string(i);
    std::string gpus = std::to_string(options_.gpus_per_node);
    nlohmann::json capacity = {
        {"cpu", "16"}, {"memory", "64Gi"}, {"pods", "110"}, {"nvidia.com/gpu", gpus}};
    nlohmann::json node = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata",
         {{"name", name},
          {"labels", {{"kubernetes.io/hostname", name}, {"tidal.dev/local", "true"}}}}},
        {"spec", nlohmann::json::object()}};
    if (!api_->store().Get({"/nodes", "", name})) {
      ApiResult created = api_->writer().Create(*nodes, "", node, WriteOptions{});
      if (!created.ok())
        return Internal("registering node " + name + ": " + created.error->message);
    }
    auto live = api_->store().Get({"/nodes", "", name});
    nlohmann::json status = *live;
    status["status"] = {{"capacity", capacity},
                        {"allocatable", capacity},
                        {"conditions",
                         {{{"type", "Ready"},
                           {"status", "True"},
                           {"reason", "KubeletReady"},
                           {"message", "tidal local process kubelet is ready"}}}},
                        {"nodeInfo", {{"kubeletVersion", "v1.32.0-tidal-local"}}}};
    ApiResult updated = api_->writer().Update(*nodes, "", name, status, "status", WriteOptions{});
    if (!updated.ok()) return Internal("node status " + name + ": " + updated.error->message);
  }
  return OkStatus();
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Stop() {
  if (kubelet_) kubelet_->Stop();  // its processes first, while the API is still there
  if (api_) api_->Stop();
}

}  // namespace tidal::local
