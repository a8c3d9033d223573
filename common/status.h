// common/status.h — errors as values across module boundaries (STYLE.md rule 2).
// Header-only so that worker/engine can use it while depending on LibTorch and header-only
// libraries only. Must not include LibTorch, gRPC or HTTP code.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tidal {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input: terminal, retrying cannot help
  kNotFound,
  kFailedPrecondition,
  kUnavailable,  // a peer or the network: retryable
  kDeadlineExceeded,
  kAborted,  // a concurrent change won (409 Conflict): re-read and retry
  kDataLoss,
  kInternal,
  // The kinds a caller tells apart without reading the message:
  kAlreadyExists,     // what a create or a one-time request asked for is there already (409)
  kUnauthenticated,   // no valid credentials (401; gRPC UNAUTHENTICATED)
  kPermissionDenied,  // credentials that may not do this (403)
  kExpired,  // a resourceVersion or continue token too old to resume from (410 Gone): relist
};

inline const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kExpired:
      return "EXPIRED";
  }
  return "UNKNOWN";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Whether trying again can help (STYLE.md rule 3).
  bool retryable() const {
    return code_ == StatusCode::kUnavailable || code_ == StatusCode::kDeadlineExceeded ||
           code_ == StatusCode::kAborted;
  }
  std::string ToString() const {
    return ok() ? "OK" : std::string(StatusCodeName(code_)) + ": " + message_;
  }
  // Prefixes the message with where the error happened ("loading config: ...").
  Status WithContext(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
inline Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status AlreadyExists(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
inline Status Unauthenticated(std::string m) {
  return Status(StatusCode::kUnauthenticated, std::move(m));
}
inline Status PermissionDenied(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}
inline Status Expired(std::string m) { return Status(StatusCode::kExpired, std::move(m)); }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit like absl::StatusOr
  StatusOr(Status status) : status_(std::move(status)) {
    if (status_.ok()) status_ = Internal("StatusOr constructed from an OK status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tidal

#define TIDAL_CONCAT_INNER(a, b) a##b
#define TIDAL_CONCAT(a, b) TIDAL_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define TIDAL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::tidal::Status tidal_status_ = (expr);        \
    if (!tidal_status_.ok()) return tidal_status_; \
  } while (0)

#define TIDAL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// `TIDAL_ASSIGN_OR_RETURN(auto x, MaybeX());` binds the value or returns the error.
#define TIDAL_ASSIGN_OR_RETURN(lhs, expr) \
  TIDAL_ASSIGN_OR_RETURN_IMPL(TIDAL_CONCAT(tidal_statusor_, __LINE__), lhs, expr)
