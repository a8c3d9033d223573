// common/http/connection.h — one TCP connection, plain or TLS (OpenSSL), with the buffered
// reads HTTP/1.1 needs: a head up to the blank line, a body by Content-Length or chunks.
// TLS clients always verify the peer against the CA they were given and check that the
// certificate names the host (IP SAN or DNS name); there is no switch to turn that off.
// Blocking I/O: each connection belongs to one thread, except Shutdown(), which any thread
// may call to wake a blocked reader (cancel a watch, stop a server).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/http/message.h"
#include "common/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace tidal::http {

class TlsContext {
 public:
  // A server context presenting `cert_pem` (leaf first, then chain) with `key_pem`.
  static StatusOr<std::shared_ptr<TlsContext>> Server(const std::string& cert_pem,
                                                      const std::string& key_pem);
  // A client context trusting only the certificates in `ca_pem`, optionally presenting a
  // client certificate.
  static StatusOr<std::shared_ptr<TlsContext>> Client(const std::string& ca_pem,
                                                      const std::string& client_cert_pem = "",
                                                      const std::string& client_key_pem = "");
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

class Connection {
 public:
  // Connects to host:port (numeric IPv4/IPv6 or a name) and, with `tls`, handshakes and
  // verifies the server's certificate for `host`.
  static StatusOr<std::unique_ptr<Connection>> Dial(const std::string& host, int port,
                                                    const std::shared_ptr<TlsContext>& tls,
                                                    std::chrono::milliseconds timeout);
  // Wraps an accepted socket (taking ownership) and, with `tls`, runs the server handshake.
  static StatusOr<std::unique_ptr<Connection>> Accept(int fd,
                                                      const std::shared_ptr<TlsContext>& tls,
                                                      std::chrono::milliseconds timeout);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Status WriteAll(std::string_view data);
  // Bytes up to and including the blank line that ends a head; NotFound when the peer closed
  // cleanly before sending anything (an idle keep-alive connection ending).
  StatusOr<std::string> ReadHead(size_t max_bytes);
  // A whole body under `framing`; InvalidArgument naming the limit when it exceeds max_bytes.
  StatusOr<std::string> ReadBody(const BodyFraming& framing, size_t max_bytes);
  // The next chunk of a chunked body; nullopt after the last (empty) chunk.
  StatusOr<std::optional<std::string>> ReadChunk(size_t max_bytes);
  // Reads of up to this long fail with DeadlineExceeded (0 = wait forever).
  void SetReadTimeout(std::chrono::milliseconds timeout);
  // True when the peer has closed its side (checked without blocking).
  bool PeerClosed();
  // Wakes any thread blocked on this connection; later reads and writes fail.
  void Shutdown();
  std::string peer_address() const { return peer_; }

 private:
  Connection(int fd, SSL* ssl, std::string peer) : fd_(fd), ssl_(ssl), peer_(std::move(peer)) {}
  // Appends at least one byte to buffer_; NotFound on a clean close.
  Status Fill();
  StatusOr<std::string> ReadLine(size_t max_bytes);
  StatusOr<std::string> ReadExactly(size_t n);

  int fd_;
  SSL* ssl_;
  std::string peer_;
  std::string buffer_;
  size_t offset_ = 0;  // bytes of buffer_ already consumed
};

}  // namespace tidal::http
