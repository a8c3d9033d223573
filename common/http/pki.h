// common/http/pki.h — a self-signed CA and certificates issued by it (ECDSA P-256, PEM), as
// `tidal local` needs on first start and the TLS tests need on every run. OpenSSL only.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace tidal::http {

struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

StatusOr<KeyPair> GenerateCa(const std::string& common_name, int valid_days);

struct CertificateRequest {
  std::string common_name;
  std::vector<std::string> organizations;  // Kubernetes reads these as groups
  std::vector<std::string> ip_addresses;   // IP SANs, e.g. 127.0.0.1
  std::vector<std::string> dns_names;      // DNS SANs, e.g. localhost
  bool server = true;                      // serverAuth, else clientAuth
  int valid_days = 365;
};
StatusOr<KeyPair> IssueCertificate(const KeyPair& ca, const CertificateRequest& request);

// The subject common name of a PEM certificate (for tests and client-certificate auth).
StatusOr<std::string> CertificateCommonName(const std::string& cert_pem);

}  // namespace tidal::http
