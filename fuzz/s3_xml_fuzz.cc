// The S3 answers (worker/objstore/s3_xml.h) from arbitrary bytes: a server, or a proxy in
// front of it, can answer anything. And the escaping of what we send: text escaped into an
// element parses back to itself (or is refused, for bytes XML cannot hold).
#include "fuzz/fuzz_input.h"
#include "worker/objstore/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal::objstore::s3;
  const std::string_view xml = tidal::fuzz::Text(data, size);
  (void)ParseError(xml);
  auto page = ParseListObjectsV2(xml);
  if (page.ok() && page->truncated && page->next_continuation_token.empty())
    tidal::fuzz::Violated("s3_xml", "a truncated page without a continuation token is accepted");
  (void)ParseInitiateMultipartUpload(xml);
  (void)ParseCompleteMultipartUpload(xml);
  (void)ParseDeleteResult(xml);

  auto back = ParseError("<Error><Code>" + XmlEscape(xml) + "</Code></Error>");
  if (back.ok() && back->code != xml)
    tidal::fuzz::Violated("s3_xml", "escaped text parses back as \"" + back->code + "\"");
  return 0;
}
