// kube/config.cc
#include "kube/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base64.h"
#include "common/yaml_json.h"

namespace tidal::kube {
namespace {

StatusOr<std::string> ReadText(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(what + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::json* FindNamed(const nlohmann::json& list, const std::string& name,
                                const char* field) {
  if (!list.is_array()) return nullptr;
  for (const auto& entry : list)
    if (entry.is_object() && entry.contains("name") && entry["name"] == name &&
        entry.contains(field) && entry[field].is_object())
      return &entry[field];
  return nullptr;
}

// "<field>-data" (base64) or "<field>" (a file, relative to the kubeconfig's directory).
StatusOr<std::string> DataOrFile(const nlohmann::json& obj, const std::string& field,
                                 const std::filesystem::path& base, const std::string& where) {
  std::string data_key = field + "-data";
  if (obj.contains(data_key) && obj[data_key].is_string()) {
    auto decoded = Base64Decode(obj[data_key].get<std::string>());
    if (!decoded) return InvalidArgument(where + "." + data_key + ": expected base64");
    return *decoded;
  }
  if (obj.contains(field) && obj[field].is_string()) {
    std::filesystem::path p = obj[field].get<std::string>();
    if (p.is_relative()) p = base / p;
    return ReadText(p.string(), where + "." + field);
  }
  return std::string();
}

// A string field: "" when absent or null (a key with no value in YAML), InvalidArgument naming
// it when it holds another type.
StatusOr<std::string> StringField(const nlohmann::json& obj, const char* key,
                                  const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string())
    return InvalidArgument("kubeconfig " + where + "." + key + ": expected a string, got " +
                           it->type_name());
  return it->get<std::string>();
}

const nlohmann::json& Field(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string Trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

StatusOr<Connection> LoadKubeconfig(const std::string& path, const std::string& context_name) {
  TIDAL_ASSIGN_OR_RETURN(std::string text, ReadText(path, "kubeconfig"));
  auto parsed = ParseYaml(text);
  if (!parsed.ok()) return InvalidArgument("kubeconfig " + path + ": " + parsed.status().message());
  const nlohmann::json& cfg = *parsed;
  if (!cfg.is_object()) return InvalidArgument("kubeconfig " + path + ": expected a mapping");
  std::string name = context_name;
  if (name.empty()) {
    TIDAL_ASSIGN_OR_RETURN(name, StringField(cfg, "current-context", path));
  }
  if (name.empty()) return InvalidArgument("kubeconfig " + path + ": current-context is not set");
  const nlohmann::json* context = FindNamed(Field(cfg, "contexts"), name, "context");
  if (!context)
    return InvalidArgument("kubeconfig " + path + ": no context named \"" + name + "\"");
  const std::string context_where = "contexts[" + name + "]";
  TIDAL_ASSIGN_OR_RETURN(std::string cluster_name, StringField(*context, "cluster", context_where));
  TIDAL_ASSIGN_OR_RETURN(std::string user_name, StringField(*context, "user", context_where));
  const nlohmann::json* cluster = FindNamed(Field(cfg, "clusters"), cluster_name, "cluster");
  if (!cluster)
    return InvalidArgument("kubeconfig " + path + ": context \"" + name + "\" names cluster \"" +
                           cluster_name + "\", which is not defined");
  std::filesystem::path base = std::filesystem::path(path).parent_path();
  Connection c;
  const std::string cluster_where = "clusters[" + cluster_name + "]";
  TIDAL_ASSIGN_OR_RETURN(c.server, StringField(*cluster, "server", cluster_where));
  if (c.server.empty())
    return InvalidArgument("kubeconfig clusters[" + cluster_name + "].server: required");
  const nlohmann::json& skip_verify = Field(*cluster, "insecure-skip-tls-verify");
  if (!skip_verify.is_null() && !skip_verify.is_boolean())
    return InvalidArgument("kubeconfig " + cluster_where +
                           ".insecure-skip-tls-verify: expected true or false, got " +
                           skip_verify.type_name());
  if (skip_verify.is_boolean() && skip_verify.get<bool>())
    return InvalidArgument("kubeconfig clusters[" + cluster_name +
                           "].insecure-skip-tls-verify: not supported; give certificate-authority "
                           "instead (TLS is always verified)");
  TIDAL_ASSIGN_OR_RETURN(c.ca_pem, DataOrFile(*cluster, "certificate-authority", base,
                                              "clusters[" + cluster_name + "]"));
  if (c.server.rfind("https://", 0) == 0 && c.ca_pem.empty())
    return InvalidArgument("kubeconfig clusters[" + cluster_name +
                           "]: an https server needs certificate-authority(-data)");
  TIDAL_ASSIGN_OR_RETURN(c.namespace_, StringField(*context, "namespace", context_where));
  if (c.namespace_.empty()) c.namespace_ = "default";
  if (const nlohmann::json* user = FindNamed(Field(cfg, "users"), user_name, "user")) {
    std::string where = "users[" + user_name + "]";
    TIDAL_ASSIGN_OR_RETURN(c.token, StringField(*user, "token", where));
    TIDAL_ASSIGN_OR_RETURN(std::string token_file, StringField(*user, "tokenFile", where));
    if (c.token.empty() && !token_file.empty()) {
      TIDAL_ASSIGN_OR_RETURN(c.token, ReadText(token_file, where + ".tokenFile"));
      c.token = Trimmed(c.token);
    }
    TIDAL_ASSIGN_OR_RETURN(c.client_cert_pem, DataOrFile(*user, "client-certificate", base, where));
    TIDAL_ASSIGN_OR_RETURN(c.client_key_pem, DataOrFile(*user, "client-key", base, where));
    if (c.client_cert_pem.empty() != c.client_key_pem.empty())
      return InvalidArgument("kubeconfig " + where +
                             ": client-certificate and client-key must be given together");
  }
  return c;
}

StatusOr<Connection> InClusterConfig(const std::map<std::string, std::string>& env,
                                     const InClusterPaths& paths) {
  auto host = env.find("KUBERNETES_SERVICE_HOST");
  auto port = env.find("KUBERNETES_SERVICE_PORT");
  if (host == env.end() || host->second.empty() || port == env.end() || port->second.empty())
    return FailedPrecondition(
        "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set");
  Connection c;
  std::string h =
      host->second.find(':') != std::string::npos ? "[" + host->second + "]" : host->second;
  c.server = "https://" + h + ":" + port->second;
  TIDAL_ASSIGN_OR_RETURN(c.token, ReadText(paths.token, "service-account token"));
  c.token = Trimmed(c.token);
  TIDAL_ASSIGN_OR_RETURN(c.ca_pem, ReadText(paths.ca, "service-account CA"));
  auto ns = ReadText(paths.namespace_, "service-account namespace");
  if (ns.ok()) c.namespace_ = Trimmed(*ns);
  return c;
}

StatusOr<Connection> DefaultConnection() {
  if (const char* kc = std::getenv("KUBECONFIG"); kc && *kc) {
    std::string first = kc;
    first = first.substr(0, first.find(':'));
    return LoadKubeconfig(first);
  }
  std::map<std::string, std::string> env;
  for (const char* name : {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"})
    if (const char* v = std::getenv(name)) env[name] = v;
  if (env.count("KUBERNETES_SERVICE_HOST")) return InClusterConfig(env);
  const char* home = std::getenv("HOME");
  return LoadKubeconfig(std::string(home ? home : "") + "/.kube/config");
}

}  // namespace tidal::kube
