/// Status and Result<T>: how every distckpt function reports failure.
///
/// A Status is either ok or a code plus a human-readable message. Messages name
/// the component, the operation, the rank, the path and the tensor involved, e.g.
///   "load: rank 3: tensor 'blocks.2.weight': chunk 5 of data-00001.bin: crc32c ..."
/// Collective functions return the same Status on every rank (see checkpoint.h).
/// Everything in this header is local; a Status or Result is a value, safe to use from one
/// thread at a time like any value (const access from several). The helpers below cannot
/// fail (short of memory for the message).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace distckpt {

/// This library's version, "MAJOR.MINOR.PATCH" (CMake's project version). Any thread;
/// never fails.
const char* version();

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  ///< the caller passed something that can never work
  kNotFound = 2,         ///< a file, checkpoint or tensor does not exist
  kCorruption = 3,       ///< bytes on disk are inconsistent (checksum, truncation, bad index)
  kIoError = 4,          ///< the operating system refused an operation (ENOSPC, EIO, ...)
  kAuthFailed = 5,       ///< authentication of encrypted data failed
  kMismatch = 6,         ///< checkpoint and state dict disagree (dtype, shape, names)
  kUnsupported = 7,      ///< a valid request this build cannot serve (e.g. newer format)
  kInternal = 8,         ///< a bug in distckpt
  kAlreadyExists = 9,    ///< the target name is taken
  kBusy = 10,            ///< refused: a previous operation is still in flight
  kAborted = 11,         ///< given up: another rank failed, or ranks did not answer in time
};

/// Stable lower-case name of a code ("invalid argument", "corruption", ...): static
/// storage, never null.
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  ///< ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "corruption: load: rank 3: ..." or "ok".
  std::string to_string() const;

  /// Returns a copy whose message is prefixed by `context + ": "`. No-op on ok.
  Status with_context(const std::string& context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status auth_failed(std::string m) { return {StatusCode::kAuthFailed, std::move(m)}; }
inline Status aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

/// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {          // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  /// Precondition: ok(); otherwise std::bad_variant_access is thrown (a caller's bug).
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal_status {
inline const Status& as_status(const Status& s) { return s; }
template <typename T>
const Status& as_status(const Result<T>& r) { return r.status(); }
}  // namespace internal_status

}  // namespace distckpt

#define DISTCKPT_CONCAT_INNER(a, b) a##b
#define DISTCKPT_CONCAT(a, b) DISTCKPT_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function if it is not ok.
/// The Status is copied (cheap when ok: an empty message) while `expr` is alive, so
/// that `f().status()` of a temporary Result is safe.
#define DISTCKPT_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                          \
    const ::distckpt::Status distckpt_status_ = ::distckpt::internal_status::as_status((expr)); \
    if (!distckpt_status_.ok()) return distckpt_status_;                                        \
  } while (0)

/// `DISTCKPT_ASSIGN_OR_RETURN(auto x, f());` declares x from the value of f(), or returns its Status.
#define DISTCKPT_ASSIGN_OR_RETURN(lhs, expr) \
  DISTCKPT_ASSIGN_OR_RETURN_IMPL(DISTCKPT_CONCAT(distckpt_result_, __LINE__), lhs, expr)
#define DISTCKPT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

/// Every program built against an installed package registers that install's helper
/// program before main (package.h); status.h is the header every other one includes.
#include "distckpt/package.h"
