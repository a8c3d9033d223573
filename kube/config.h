// kube/config.h — where the API server is and how to authenticate: from a kubeconfig
// (current or named context: server, certificate-authority(-data), token/tokenFile,
// client-certificate(-data)/client-key(-data), namespace) or from inside a pod (service-account
// token and CA, KUBERNETES_SERVICE_HOST/PORT), as client-go's clientcmd and rest.InClusterConfig.
// TLS verification is never turned off: insecure-skip-tls-verify is refused with a message.
// Pure apart from reading the files it is pointed at.
#pragma once

#include <map>
#include <string>

#include "common/status.h"

namespace tidal::kube {

struct Connection {
  std::string server;  // https://host:port
  std::string ca_pem;
  std::string token;
  std::string client_cert_pem, client_key_pem;
  std::string namespace_ = "default";
};

// `context`: "" for current-context.
StatusOr<Connection> LoadKubeconfig(const std::string& path, const std::string& context = "");

struct InClusterPaths {
  std::string token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_ = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};
// `env`: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT (passed in, so tests need no
// process environment).
StatusOr<Connection> InClusterConfig(const std::map<std::string, std::string>& env,
                                     const InClusterPaths& paths = {});

// $KUBECONFIG (first entry), else in-cluster when KUBERNETES_SERVICE_HOST is set, else
// ~/.kube/config.
StatusOr<Connection> DefaultConnection();

}  // namespace tidal::kube
