// worker/objstore/s3_xml.cc
#include "worker/objstore/s3_xml.h"

#include <expat.h>

#include <charconv>
#include <memory>

namespace tidal::objstore::s3 {
namespace {

// A small element tree: enough for S3's answers, which carry no mixed content.
struct Element {
  std::string name;
  std::string text;
  std::vector<Element> children;

  const Element* Child(std::string_view child_name) const {
    for (const Element& c : children)
      if (c.name == child_name) return &c;
    return nullptr;
  }
  std::string ChildText(std::string_view child_name) const {
    const Element* c = Child(child_name);
    return c ? c->text : std::string();
  }
};

struct ParseState {
  Element root;                 // a synthetic parent of the document element
  std::vector<Element*> stack;  // open elements; stable while open (see OnStart)
  std::string refused;          // why the parser was stopped, if it was
  XML_Parser parser = nullptr;
};

void XMLCALL OnStart(void* data, const XML_Char* name, const XML_Char**) {
  auto* state = static_cast<ParseState*>(data);
  // Only the innermost open element gains children, so pointers to the open ones stay valid.
  Element* parent = state->stack.back();
  parent->children.push_back(Element{name, "", {}});
  state->stack.push_back(&parent->children.back());
}

void XMLCALL OnEnd(void* data, const XML_Char*) {
  static_cast<ParseState*>(data)->stack.pop_back();
}

void XMLCALL OnText(void* data, const XML_Char* text, int len) {
  auto* state = static_cast<ParseState*>(data);
  state->stack.back()->text.append(text, static_cast<size_t>(len));
}

// S3 never sends a DOCTYPE; refusing one rules out entity-expansion tricks from a hostile
// endpoint.
void XMLCALL OnDoctype(void* data, const XML_Char*, const XML_Char*, const XML_Char*, int) {
  auto* state = static_cast<ParseState*>(data);
  state->refused = "a DOCTYPE declaration is not accepted";
  XML_StopParser(state->parser, XML_FALSE);
}

struct ParserDeleter {
  void operator()(XML_ParserStruct* p) const { XML_ParserFree(p); }
};

// The document element of `xml`, which must be named `root_name`.
StatusOr<Element> ParseDocument(std::string_view xml, std::string_view root_name) {
  std::unique_ptr<XML_ParserStruct, ParserDeleter> parser(XML_ParserCreate("UTF-8"));
  if (!parser) return Internal("s3: cannot create an XML parser");
  ParseState state;
  state.parser = parser.get();
  state.stack.push_back(&state.root);
  XML_SetUserData(parser.get(), &state);
  XML_SetElementHandler(parser.get(), OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser.get(), OnText);
  XML_SetStartDoctypeDeclHandler(parser.get(), OnDoctype);
  const std::string what = "s3: malformed XML answer (expected <" + std::string(root_name) + ">)";
  if (xml.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    return InvalidArgument(what + ": too large");
  if (XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE) !=
      XML_STATUS_OK) {
    if (!state.refused.empty()) return InvalidArgument(what + ": " + state.refused);
    return InvalidArgument(what + ": " + XML_ErrorString(XML_GetErrorCode(parser.get())) +
                           " at line " + std::to_string(XML_GetCurrentLineNumber(parser.get())));
  }
  if (state.root.children.size() != 1) return InvalidArgument(what + ": no document element");
  Element doc = std::move(state.root.children.front());
  if (doc.name != root_name) return InvalidArgument(what + ": got <" + doc.name + ">");
  return doc;
}

StatusOr<uint64_t> ParseSize(const std::string& text, const std::string& key) {
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    return InvalidArgument("s3: ListObjectsV2 answer: <Size> of \"" + key +
                           "\" is not a byte count: \"" + text + "\"");
  return value;
}

ErrorBody ErrorFrom(const Element& e) {
  return ErrorBody{e.ChildText("Code"), e.ChildText("Message"), e.ChildText("Key"),
                   e.ChildText("BucketName"), e.ChildText("RequestId")};
}

}  // namespace

StatusOr<ErrorBody> ParseError(std::string_view xml) {
  TIDAL_ASSIGN_OR_RETURN(Element doc, ParseDocument(xml, "Error"));
  ErrorBody error = ErrorFrom(doc);
  if (error.code.empty()) return InvalidArgument("s3: <Error> answer without a <Code>");
  return error;
}

StatusOr<ListPage> ParseListObjectsV2(std::string_view xml) {
  TIDAL_ASSIGN_OR_RETURN(Element doc, ParseDocument(xml, "ListBucketResult"));
  ListPage page;
  for (const Element& c : doc.children) {
    if (c.name != "Contents") continue;
    const Element* key = c.Child("Key");
    if (!key) return InvalidArgument("s3: ListObjectsV2 answer: <Contents> without a <Key>");
    TIDAL_ASSIGN_OR_RETURN(uint64_t size, ParseSize(c.ChildText("Size"), key->text));
    page.objects.push_back({key->text, size});
  }
  std::string truncated = doc.ChildText("IsTruncated");
  if (truncated != "true" && truncated != "false" && !truncated.empty())
    return InvalidArgument("s3: ListObjectsV2 answer: <IsTruncated> is \"" + truncated + "\"");
  page.truncated = truncated == "true";
  page.next_continuation_token = doc.ChildText("NextContinuationToken");
  if (page.truncated && page.next_continuation_token.empty())
    return InvalidArgument(
        "s3: ListObjectsV2 answer is truncated but has no <NextContinuationToken>");
  return page;
}

StatusOr<std::string> ParseInitiateMultipartUpload(std::string_view xml) {
  TIDAL_ASSIGN_OR_RETURN(Element doc, ParseDocument(xml, "InitiateMultipartUploadResult"));
  std::string upload_id = doc.ChildText("UploadId");
  if (upload_id.empty())
    return InvalidArgument("s3: CreateMultipartUpload answer without an <UploadId>");
  return upload_id;
}

StatusOr<CompleteResult> ParseCompleteMultipartUpload(std::string_view xml) {
  CompleteResult result;
  if (auto error = ParseError(xml); error.ok()) {
    result.failed = true;
    result.error = *error;
    return result;
  }
  TIDAL_ASSIGN_OR_RETURN(Element doc, ParseDocument(xml, "CompleteMultipartUploadResult"));
  result.etag = doc.ChildText("ETag");
  return result;
}

StatusOr<std::vector<DeleteFailure>> ParseDeleteResult(std::string_view xml) {
  TIDAL_ASSIGN_OR_RETURN(Element doc, ParseDocument(xml, "DeleteResult"));
  std::vector<DeleteFailure> failures;
  for (const Element& c : doc.children)
    if (c.name == "Error")
      failures.push_back({c.ChildText("Key"), c.ChildText("Code"), c.ChildText("Message")});
  return failures;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '\r':
        // A literal CR would reach the server as LF (XML's end-of-line handling): a key with one
        // would name another object. (Found by fuzz/s3_xml_fuzz.cc.)
        out += "&#13;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace tidal::objstore::s3
