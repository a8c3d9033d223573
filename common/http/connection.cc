// common/http/connection.cc
#include "common/http/connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>

namespace tidal::http {
namespace {

// A peer that goes away mid-write must give EPIPE, not kill the process (OpenSSL writes with
// write(2), which has no MSG_NOSIGNAL).
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] { signal(SIGPIPE, SIG_IGN); });
}

std::string OpenSslError(const std::string& what) {
  std::string out = what;
  unsigned long err;
  while ((err = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(err, buf, sizeof(buf));
    out += ": ";
    out += buf;
  }
  return out;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};

void SetTimeouts(int fd, std::chrono::milliseconds timeout, bool send_too) {
  timeval tv{};
  tv.tv_sec = static_cast<long>(timeout.count() / 1000);
  tv.tv_usec = static_cast<long>((timeout.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (send_too) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Server(const std::string& cert_pem,
                                                         const std::string& key_pem) {
  IgnoreSigpipeOnce();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return Internal(OpenSslError("SSL_CTX_new"));
  std::shared_ptr<TlsContext> out(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  std::unique_ptr<BIO, BioDeleter> cert_bio(BIO_new_mem_buf(cert_pem.data(), int(cert_pem.size())));
  X509* leaf = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  if (!leaf) return InvalidArgument(OpenSslError("serving certificate: expected PEM"));
  int rc = SSL_CTX_use_certificate(ctx, leaf);
  X509_free(leaf);
  if (rc != 1) return InvalidArgument(OpenSslError("serving certificate"));
  while (X509* extra = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add_extra_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      return InvalidArgument(OpenSslError("certificate chain"));
    }
  }
  ERR_clear_error();  // the loop above ends on a "no start line" error
  std::unique_ptr<BIO, BioDeleter> key_bio(BIO_new_mem_buf(key_pem.data(), int(key_pem.size())));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (!key) return InvalidArgument(OpenSslError("serving key: expected a PEM private key"));
  rc = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (rc != 1 || SSL_CTX_check_private_key(ctx) != 1)
    return InvalidArgument(OpenSslError("serving key does not match the certificate"));
  return out;
}

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Client(const std::string& ca_pem,
                                                         const std::string& client_cert_pem,
                                                         const std::string& client_key_pem) {
  IgnoreSigpipeOnce();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return Internal(OpenSslError("SSL_CTX_new"));
  std::shared_ptr<TlsContext> out(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  std::unique_ptr<BIO, BioDeleter> ca_bio(BIO_new_mem_buf(ca_pem.data(), int(ca_pem.size())));
  int added = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, ca);
    X509_free(ca);
    ++added;
  }
  ERR_clear_error();
  if (added == 0)
    return InvalidArgument("certificate-authority: expected at least one PEM certificate");
  if (!client_cert_pem.empty() || !client_key_pem.empty()) {
    std::unique_ptr<BIO, BioDeleter> cb(
        BIO_new_mem_buf(client_cert_pem.data(), int(client_cert_pem.size())));
    X509* cert = PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr);
    if (!cert) return InvalidArgument(OpenSslError("client-certificate: expected PEM"));
    int rc = SSL_CTX_use_certificate(ctx, cert);
    X509_free(cert);
    std::unique_ptr<BIO, BioDeleter> kb(
        BIO_new_mem_buf(client_key_pem.data(), int(client_key_pem.size())));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr);
    if (rc != 1 || !key) {
      EVP_PKEY_free(key);
      return InvalidArgument(OpenSslError("client-key: expected a PEM private key"));
    }
    rc = SSL_CTX_use_PrivateKey(ctx, key);
    EVP_PKEY_free(key);
    if (rc != 1 || SSL_CTX_check_private_key(ctx) != 1)
      return InvalidArgument(OpenSslError("client-key does not match client-certificate"));
  }
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

StatusOr<std::unique_ptr<Connection>> Connection::Dial(const std::string& host, int port,
                                                       const std::shared_ptr<TlsContext>& tls,
                                                       std::chrono::milliseconds timeout) {
  IgnoreSigpipeOnce();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0)
    return Unavailable("resolving " + host + ": " + gai_strerror(rc));
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    // Connect with a deadline: non-blocking connect, then poll.
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int ready = poll(&p, 1, static_cast<int>(timeout.count()));
      if (ready == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (ready == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc == 0) {
      fcntl(fd, F_SETFL, flags);
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  std::string peer = host + ":" + port_text;
  if (fd < 0) return Unavailable("connecting to " + peer + ": " + last_error);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SetTimeouts(fd, timeout, true);
  SSL* ssl = nullptr;
  if (tls) {
    ssl = SSL_new(tls->get());
    SSL_set_fd(ssl, fd);
    in6_addr ip6;
    in_addr ip4;
    bool is_ip =
        inet_pton(AF_INET, host.c_str(), &ip4) == 1 || inet_pton(AF_INET6, host.c_str(), &ip6) == 1;
    if (is_ip) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, host.c_str());
      SSL_set1_host(ssl, host.c_str());
    }
    if (SSL_connect(ssl) != 1) {
      long verify = SSL_get_verify_result(ssl);
      std::string why = verify != X509_V_OK ? std::string("certificate verification failed: ") +
                                                  X509_verify_cert_error_string(verify)
                                            : OpenSslError("TLS handshake failed");
      SSL_free(ssl);
      close(fd);
      return Unavailable("connecting to " + peer + ": " + why);
    }
  }
  return std::unique_ptr<Connection>(new Connection(fd, ssl, peer));
}

StatusOr<std::unique_ptr<Connection>> Connection::Accept(int fd,
                                                         const std::shared_ptr<TlsContext>& tls,
                                                         std::chrono::milliseconds timeout) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  SetTimeouts(fd, timeout, true);
  SSL* ssl = nullptr;
  if (tls) {
    ssl = SSL_new(tls->get());
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1) {
      std::string why = OpenSslError("TLS handshake");
      SSL_free(ssl);
      close(fd);
      return Unavailable(why);
    }
  }
  return std::unique_ptr<Connection>(new Connection(fd, ssl, text));
}

Connection::~Connection() {
  if (ssl_) {
    SSL_set_quiet_shutdown(ssl_, 1);
    SSL_free(ssl_);
  }
  if (fd_ >= 0) close(fd_);
}

void Connection::SetReadTimeout(std::chrono::milliseconds timeout) {
  SetTimeouts(fd_, timeout, false);
}

bool Connection::PeerClosed() {
  if (offset_ < buffer_.size()) return false;
  if (ssl_ && SSL_pending(ssl_) > 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  // Readable: data or EOF. A peer of a streamed response sends nothing, so peek for EOF.
  char c;
  ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

void Connection::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

Status Connection::WriteAll(std::string_view data) {
  while (!data.empty()) {
    ssize_t n;
    if (ssl_) {
      n = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
      if (n <= 0) return Unavailable(OpenSslError("writing to " + peer_));
    } else {
      n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Unavailable("writing to " + peer_ + ": " + std::strerror(errno));
      }
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return OkStatus();
}

Status Connection::Fill() {
  if (offset_ > 0 && offset_ == buffer_.size()) {
    buffer_.clear();
    offset_ = 0;
  } else if (offset_ > 65536) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  char chunk[16384];
  for (;;) {
    ssize_t n;
    if (ssl_) {
      n = SSL_read(ssl_, chunk, sizeof(chunk));
      if (n <= 0) {
        int err = SSL_get_error(ssl_, static_cast<int>(n));
        if (err == SSL_ERROR_ZERO_RETURN) return NotFound("connection closed by " + peer_);
        if (err == SSL_ERROR_SYSCALL && errno == 0)
          return NotFound("connection closed by " + peer_);
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          return DeadlineExceeded("reading from " + peer_ + ": timed out");
        ERR_clear_error();
        return Unavailable("reading from " + peer_ + ": connection lost");
      }
    } else {
      n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          return DeadlineExceeded("reading from " + peer_ + ": timed out");
        return Unavailable("reading from " + peer_ + ": " + std::strerror(errno));
      }
      if (n == 0) return NotFound("connection closed by " + peer_);
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return OkStatus();
  }
}

StatusOr<std::string> Connection::ReadHead(size_t max_bytes) {
  // Bytes after offset_ already searched; relative, because Fill() may compact the buffer.
  size_t scanned = 0;
  for (;;) {
    size_t from = offset_ + (scanned > 3 ? scanned - 3 : 0);
    size_t end = buffer_.find("\r\n\r\n", from);
    if (end != std::string::npos) {
      std::string head = buffer_.substr(offset_, end + 4 - offset_);
      offset_ = end + 4;
      return head;
    }
    if (buffer_.size() - offset_ > max_bytes)
      return InvalidArgument("request head exceeds " + std::to_string(max_bytes) + " bytes");
    scanned = buffer_.size() - offset_;
    Status s = Fill();
    if (!s.ok()) {
      if (s.code() == StatusCode::kNotFound && scanned > 0)
        return Unavailable("connection closed mid-head by " + peer_);
      return s;
    }
  }
}

StatusOr<std::string> Connection::ReadExactly(size_t n) {
  while (buffer_.size() - offset_ < n) {
    Status s = Fill();
    if (!s.ok())
      return s.code() == StatusCode::kNotFound
                 ? Unavailable("connection closed mid-body by " + peer_)
                 : s;
  }
  std::string out = buffer_.substr(offset_, n);
  offset_ += n;
  return out;
}

StatusOr<std::string> Connection::ReadLine(size_t max_bytes) {
  for (;;) {
    size_t eol = buffer_.find("\r\n", offset_);
    if (eol != std::string::npos) {
      std::string line = buffer_.substr(offset_, eol - offset_);
      offset_ = eol + 2;
      return line;
    }
    if (buffer_.size() - offset_ > max_bytes) return InvalidArgument("chunk header too long");
    Status s = Fill();
    if (!s.ok())
      return s.code() == StatusCode::kNotFound
                 ? Unavailable("connection closed mid-body by " + peer_)
                 : s;
  }
}

StatusOr<std::optional<std::string>> Connection::ReadChunk(size_t max_bytes) {
  TIDAL_ASSIGN_OR_RETURN(std::string size_line, ReadLine(1024));
  size_t semi = size_line.find(';');  // chunk extensions are ignored (RFC 9112 §7.1.1)
  std::string hex = size_line.substr(0, semi);
  uint64_t size = 0;
  auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), size, 16);
  if (ec != std::errc() || ptr != hex.data() + hex.size() || hex.empty())
    return InvalidArgument("malformed chunk size \"" + hex + "\"");
  if (size > max_bytes)
    return InvalidArgument("chunk of " + std::to_string(size) + " bytes exceeds the limit of " +
                           std::to_string(max_bytes));
  if (size == 0) {
    // Trailer fields, then the final blank line.
    for (;;) {
      TIDAL_ASSIGN_OR_RETURN(std::string trailer, ReadLine(8192));
      if (trailer.empty()) break;
    }
    return std::optional<std::string>();
  }
  TIDAL_ASSIGN_OR_RETURN(std::string data, ReadExactly(size));
  TIDAL_ASSIGN_OR_RETURN(std::string crlf, ReadExactly(2));
  if (crlf != "\r\n") return InvalidArgument("chunk not followed by CRLF");
  return std::optional<std::string>(std::move(data));
}

StatusOr<std::string> Connection::ReadBody(const BodyFraming& framing, size_t max_bytes) {
  switch (framing.kind) {
    case BodyFraming::kLength:
      if (framing.length > max_bytes)
        return InvalidArgument("body of " + std::to_string(framing.length) +
                               " bytes exceeds the limit of " + std::to_string(max_bytes));
      return ReadExactly(framing.length);
    case BodyFraming::kChunked: {
      std::string body;
      for (;;) {
        TIDAL_ASSIGN_OR_RETURN(auto chunk, ReadChunk(max_bytes));
        if (!chunk) return body;
        if (body.size() + chunk->size() > max_bytes)
          return InvalidArgument("body exceeds the limit of " + std::to_string(max_bytes) +
                                 " bytes");
        body += *chunk;
      }
    }
    case BodyFraming::kUntilClose: {
      for (;;) {
        if (buffer_.size() - offset_ > max_bytes)
          return InvalidArgument("body exceeds the limit of " + std::to_string(max_bytes) +
                                 " bytes");
        Status s = Fill();
        if (s.code() == StatusCode::kNotFound) break;
        TIDAL_RETURN_IF_ERROR(s);
      }
      std::string body = buffer_.substr(offset_);
      offset_ = buffer_.size();
      return body;
    }
  }
  return Internal("unknown body framing");
}

}  // namespace tidal::http
