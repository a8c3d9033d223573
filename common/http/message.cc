// common/http/message.cc
#include "common/http/message.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/strings.h"

namespace tidal::http {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) ||
           std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
  });
}

// Splits the head into lines and parses every header line after the first.
Status ParseHeaderLines(std::string_view head, std::string_view& first_line, Headers& headers) {
  size_t eol = head.find("\r\n");
  first_line = head.substr(0, eol);
  if (eol == std::string_view::npos) return OkStatus();
  std::string_view rest = head.substr(eol + 2);
  while (!rest.empty()) {
    eol = rest.find("\r\n");
    std::string_view line = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 2);
    if (line.empty()) continue;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon)))
      return InvalidArgument("malformed header line");
    headers.Add(std::string(line.substr(0, colon)), std::string(Trim(line.substr(colon + 1))));
  }
  return OkStatus();
}

StatusOr<uint64_t> ParseContentLength(const std::string& value) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || ptr != value.data() + value.size() || value.empty())
    return InvalidArgument("Content-Length: expected a byte count, got \"" + value + "\"");
  return n;
}

StatusOr<BodyFraming> FramingFromHeaders(const Headers& headers, bool until_close_allowed) {
  BodyFraming framing;
  if (auto te = headers.Get("transfer-encoding")) {
    if (AsciiLower(*te) != "chunked")
      return InvalidArgument("Transfer-Encoding: only chunked is supported, got \"" + *te + "\"");
    framing.kind = BodyFraming::kChunked;
    return framing;
  }
  if (auto cl = headers.Get("content-length")) {
    TIDAL_ASSIGN_OR_RETURN(framing.length, ParseContentLength(*cl));
    return framing;
  }
  if (until_close_allowed) framing.kind = BodyFraming::kUntilClose;
  return framing;
}

}  // namespace

void Headers::Set(std::string name, std::string value) {
  std::string key = AsciiLower(name);
  std::erase_if(entries_, [&](const auto& e) { return e.first == key; });
  entries_.emplace_back(std::move(key), std::move(value));
}

void Headers::Add(std::string name, std::string value) {
  entries_.emplace_back(AsciiLower(name), std::move(value));
}

std::optional<std::string> Headers::Get(std::string_view name) const {
  std::string key = AsciiLower(name);
  for (const auto& [k, v] : entries_)
    if (k == key) return v;
  return std::nullopt;
}

std::optional<std::string> Request::QueryValue(std::string_view key) const {
  for (const auto& [k, v] : query)
    if (k == key) return v;
  return std::nullopt;
}

std::string ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "Request Entity Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

StatusOr<std::string> PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(s[i + 2])))
        return InvalidArgument("malformed percent-encoding in \"" + std::string(s) + "\"");
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string PercentEncode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

Status ParseTarget(Request& request) {
  std::string_view target = request.target;
  size_t q = target.find('?');
  TIDAL_ASSIGN_OR_RETURN(request.path, PercentDecode(target.substr(0, q), false));
  request.query.clear();
  if (q == std::string_view::npos) return OkStatus();
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    TIDAL_ASSIGN_OR_RETURN(std::string key, PercentDecode(pair.substr(0, eq), true));
    std::string value;
    if (eq != std::string_view::npos) {
      TIDAL_ASSIGN_OR_RETURN(value, PercentDecode(pair.substr(eq + 1), true));
    }
    request.query.emplace_back(std::move(key), std::move(value));
  }
  return OkStatus();
}

Status ParseRequestHead(std::string_view head, Request& request) {
  std::string_view first;
  TIDAL_RETURN_IF_ERROR(ParseHeaderLines(head, first, request.headers));
  size_t sp1 = first.find(' ');
  size_t sp2 = first.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return InvalidArgument("malformed request line");
  request.method = std::string(first.substr(0, sp1));
  request.target = std::string(first.substr(sp1 + 1, sp2 - sp1 - 1));
  std::string_view version = first.substr(sp2 + 1);
  if (!IsToken(request.method)) return InvalidArgument("malformed request method");
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return InvalidArgument("unsupported HTTP version \"" + std::string(version) + "\"");
  if (request.target.empty() || request.target[0] != '/')
    return InvalidArgument("request target must be an absolute path");
  return ParseTarget(request);
}

Status ParseResponseHead(std::string_view head, Response& response) {
  std::string_view first;
  TIDAL_RETURN_IF_ERROR(ParseHeaderLines(head, first, response.headers));
  if (first.size() < 12 || first.substr(0, 5) != "HTTP/")
    return InvalidArgument("malformed status line");
  int status = 0;
  auto [ptr, ec] = std::from_chars(first.data() + 9, first.data() + 12, status);
  if (ec != std::errc() || ptr != first.data() + 12)
    return InvalidArgument("malformed status code");
  response.status = status;
  return OkStatus();
}

std::string SerializeRequestHead(const Request& request) {
  std::string out = request.method + " " + request.target + " HTTP/1.1\r\n";
  for (const auto& [k, v] : request.headers.entries()) out += k + ": " + v + "\r\n";
  return out + "\r\n";
}

std::string SerializeResponseHead(const Response& response) {
  std::string out =
      "HTTP/1.1 " + std::to_string(response.status) + " " + ReasonPhrase(response.status) + "\r\n";
  for (const auto& [k, v] : response.headers.entries()) out += k + ": " + v + "\r\n";
  return out + "\r\n";
}

std::string EncodeChunk(std::string_view data) {
  char size[32];
  auto [end, ec] = std::to_chars(size, size + sizeof(size), data.size(), 16);
  (void)ec;
  std::string out(size, end);
  out += "\r\n";
  out.append(data);
  out += "\r\n";
  return out;
}

StatusOr<BodyFraming> RequestFraming(const Headers& headers) {
  return FramingFromHeaders(headers, false);
}

StatusOr<BodyFraming> ResponseFraming(const std::string& method, int status,
                                      const Headers& headers) {
  // RFC 9112 §6.3: HEAD answers, 1xx, 204 and 304 never have a body.
  if (method == "HEAD" || status / 100 == 1 || status == 204 || status == 304) return BodyFraming{};
  return FramingFromHeaders(headers, true);
}

}  // namespace tidal::http
