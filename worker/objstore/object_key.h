// worker/objstore/object_key.h — what an object key may look like, checked the same way by
// every store so that a checkpoint written to file:// can be copied to s3:// and back.
// A key is '/'-separated and relative ("step-00000015/manifest.json"); the file store turns
// it into a path, so anything a file system would reinterpret is refused. Depends on
// common/status.h only.
#pragma once

#include <string_view>

#include "common/status.h"

namespace tidal::objstore {

// S3's limit on a key's length in bytes (the root prefix counts too; checked by the S3 store).
inline constexpr size_t kMaxKeyBytes = 1024;

// The file store writes a key through a temporary sibling whose name starts with this; keys
// may not have a segment that starts with it, so List can skip temporaries without ever
// hiding a real object.
inline constexpr std::string_view kTempPrefix = ".tidal-tmp-";

// InvalidArgument naming the key unless it is non-empty, at most kMaxKeyBytes, valid UTF-8
// without control characters, relative (no leading '/'), and every '/'-separated segment is
// non-empty, not "." or "..", and does not start with kTempPrefix.
Status ValidateKey(std::string_view key);

// A List prefix: "" (everything), or the start of a key ("step-0001", "step-00000015/"). The
// same rules as keys, except that it may end with '/' and its last segment may be partial.
Status ValidatePrefix(std::string_view prefix);

}  // namespace tidal::objstore
