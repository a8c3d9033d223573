// common/http/message.h — HTTP/1.1 requests and responses as plain values, and the pure
// parts of the wire format (head parsing, chunked framing, query strings). The socket code in
// connection.h/server.h/client.h uses these; unit tests check them without sockets.
// Depends on the standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tidal::http {

// Header names compare case-insensitively (RFC 9110 §5.1); we store them lower-cased.
class Headers {
 public:
  void Set(std::string name, std::string value);
  void Add(std::string name, std::string value);
  std::optional<std::string> Get(std::string_view name) const;
  bool Has(std::string_view name) const { return Get(name).has_value(); }
  const std::vector<std::pair<std::string, std::string>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

struct Request {
  std::string method;
  std::string target;  // as sent: path?query
  Headers headers;
  std::string body;

  // Split from target by ParseTarget: path percent-decoded, query as decoded pairs.
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;
  std::optional<std::string> QueryValue(std::string_view key) const;
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;
};

std::string ReasonPhrase(int status);

// "a%2Fb" → "a/b"; '+' is a space only in query strings (form encoding, as Go's url.Query).
StatusOr<std::string> PercentDecode(std::string_view s, bool plus_is_space);
// RFC 3986: every byte but the unreserved ones (A–Z a–z 0–9 - _ . ~) as %XX in upper case;
// `keep_slash` leaves '/' as is (paths).
std::string PercentEncode(std::string_view s, bool keep_slash = false);
// Fills request.path and request.query from request.target.
Status ParseTarget(Request& request);

// Parses "METHOD target HTTP/1.1\r\nName: value\r\n...\r\n" (the blank line excluded).
Status ParseRequestHead(std::string_view head, Request& request);
// Parses "HTTP/1.1 200 OK\r\n..." likewise.
Status ParseResponseHead(std::string_view head, Response& response);

std::string SerializeRequestHead(const Request& request);
std::string SerializeResponseHead(const Response& response);

// One chunk of a chunked body ("1a\r\n<data>\r\n"); the empty chunk ends the body.
std::string EncodeChunk(std::string_view data);

// Body length a message announces: a byte count, chunked, or (responses only) until close.
struct BodyFraming {
  enum Kind { kLength, kChunked, kUntilClose } kind = kLength;
  uint64_t length = 0;
};
StatusOr<BodyFraming> RequestFraming(const Headers& headers);
StatusOr<BodyFraming> ResponseFraming(const std::string& method, int status,
                                      const Headers& headers);

}  // namespace tidal::http
