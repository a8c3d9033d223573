// common/http/pki.cc
#include "common/http/pki.h"

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include <memory>

namespace tidal::http {
namespace {

struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using Cert = std::unique_ptr<X509, X509Deleter>;

StatusOr<Pkey> NewKey() {
  Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return Internal("generating an EC P-256 key failed");
  return key;
}

std::string ToPem(X509* cert) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string ToPem(EVP_PKEY* key) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return Internal("certificate extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return OkStatus();
}

StatusOr<Cert> NewCert(const std::string& cn, const std::vector<std::string>& orgs, int days,
                       EVP_PKEY* key) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  // A random 127-bit serial, as RFC 5280 §4.1.2.2 allows (positive, ≤ 20 bytes).
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // tolerate clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  for (const auto& o : orgs)
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(o.c_str()), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_pubkey(cert.get(), key);
  return cert;
}

}  // namespace

StatusOr<KeyPair> GenerateCa(const std::string& common_name, int valid_days) {
  TIDAL_ASSIGN_OR_RETURN(Pkey key, NewKey());
  TIDAL_ASSIGN_OR_RETURN(Cert cert, NewCert(common_name, {}, valid_days, key.get()));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  TIDAL_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE"));
  TIDAL_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  TIDAL_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return Internal("signing the CA");
  return KeyPair{ToPem(cert.get()), ToPem(key.get())};
}

StatusOr<KeyPair> IssueCertificate(const KeyPair& ca, const CertificateRequest& request) {
  std::unique_ptr<BIO, BioDeleter> cb(BIO_new_mem_buf(ca.cert_pem.data(), int(ca.cert_pem.size())));
  Cert ca_cert(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  std::unique_ptr<BIO, BioDeleter> kb(BIO_new_mem_buf(ca.key_pem.data(), int(ca.key_pem.size())));
  Pkey ca_key(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
  if (!ca_cert || !ca_key) return InvalidArgument("CA: expected a PEM certificate and key");
  TIDAL_ASSIGN_OR_RETURN(Pkey key, NewKey());
  TIDAL_ASSIGN_OR_RETURN(Cert cert, NewCert(request.common_name, request.organizations,
                                            request.valid_days, key.get()));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  TIDAL_RETURN_IF_ERROR(
      AddExtension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  TIDAL_RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_key_usage,
                                     "critical,digitalSignature,keyEncipherment"));
  TIDAL_RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_ext_key_usage,
                                     request.server ? "serverAuth" : "clientAuth"));
  TIDAL_RETURN_IF_ERROR(
      AddExtension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  std::vector<std::string> names;
  for (const auto& ip : request.ip_addresses) names.push_back("IP:" + ip);
  for (const auto& dns : request.dns_names) names.push_back("DNS:" + dns);
  std::string sans;
  for (const auto& n : names) {
    if (!sans.empty()) sans.push_back(',');
    sans.append(n);
  }
  if (!sans.empty())
    TIDAL_RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_subject_alt_name, sans));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0)
    return Internal("signing certificate for " + request.common_name);
  return KeyPair{ToPem(cert.get()), ToPem(key.get())};
}

StatusOr<std::string> CertificateCommonName(const std::string& cert_pem) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_mem_buf(cert_pem.data(), int(cert_pem.size())));
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return InvalidArgument("expected a PEM certificate");
  char cn[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof(cn));
  return std::string(cn);
}

}  // namespace tidal::http
