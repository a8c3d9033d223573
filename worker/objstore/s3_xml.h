// worker/objstore/s3_xml.h — the XML S3 answers with (ListObjectsV2, errors, multipart
// upload, multi-object delete), parsed with expat into plain structs, and the escaping of
// the XML bodies we send. Pure functions of strings: tested from fixed answers without a
// server. Reference: https://docs.aws.amazon.com/AmazonS3/latest/API/API_Operations.html
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/objstore/object_store.h"

namespace tidal::objstore::s3 {

// <Error><Code>NoSuchKey</Code><Message>…</Message><Key>…</Key>…</Error>
struct ErrorBody {
  std::string code;
  std::string message;
  std::string key;          // NoSuchKey
  std::string bucket_name;  // NoSuchBucket
  std::string request_id;
};
StatusOr<ErrorBody> ParseError(std::string_view xml);

// <ListBucketResult> of ListObjectsV2. Keys are as S3 has them (the store's root prefix
// included).
struct ListPage {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_continuation_token;
};
StatusOr<ListPage> ParseListObjectsV2(std::string_view xml);

// <InitiateMultipartUploadResult>: the UploadId.
StatusOr<std::string> ParseInitiateMultipartUpload(std::string_view xml);

// CompleteMultipartUpload answers 200 OK and may still fail: S3 sends the status line early
// and an <Error> body later. `failed` tells which.
struct CompleteResult {
  bool failed = false;
  std::string etag;  // when !failed
  ErrorBody error;   // when failed
};
StatusOr<CompleteResult> ParseCompleteMultipartUpload(std::string_view xml);

// <DeleteResult>: the keys S3 could not delete (quiet mode lists only those).
struct DeleteFailure {
  std::string key;
  std::string code;
  std::string message;
};
StatusOr<std::vector<DeleteFailure>> ParseDeleteResult(std::string_view xml);

// Escapes &, <, >, ", ' and CR for element text (CR as a character reference: XML turns a
// literal one into LF).
std::string XmlEscape(std::string_view text);

}  // namespace tidal::objstore::s3
