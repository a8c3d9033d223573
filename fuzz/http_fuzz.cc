// The HTTP/1.1 wire format (common/http/message.h) from arbitrary bytes: every request the
// `tidal local` API server, the worker's /metrics and the object-store client parse crosses it.
// Fields: a request head, a response head, a percent-encoded string. Encoding then decoding
// gives back the bytes; a serialized head parses back to the same request.
#include "common/http/message.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const auto fields = fuzz::Fields(data, size, 3);
  http::Request request;
  if (http::ParseRequestHead(fields[0], request).ok()) {
    (void)http::ParseTarget(request);
    (void)http::RequestFraming(request.headers);
    (void)request.QueryValue("watch");
    http::Request again;
    std::string head = http::SerializeRequestHead(request);
    head.resize(head.size() - 2);  // the blank line that ends a head is not part of it
    if (!http::ParseRequestHead(head, again).ok() || again.method != request.method ||
        again.target != request.target || again.headers.entries() != request.headers.entries())
      fuzz::Violated("http", "a parsed request head does not survive serializing");
  }
  http::Response response;
  if (http::ParseResponseHead(fields[1], response).ok())
    (void)http::ResponseFraming(request.method.empty() ? "GET" : request.method, response.status,
                                response.headers);
  for (bool plus_is_space : {false, true}) (void)http::PercentDecode(fields[2], plus_is_space);
  for (bool keep_slash : {false, true}) {
    auto back = http::PercentDecode(http::PercentEncode(fields[2], keep_slash), false);
    if (!back.ok() || *back != fields[2])
      fuzz::Violated("http", "PercentDecode(PercentEncode(s)) != s");
  }
  return 0;
}
