#include "distckpt/status.h"

namespace distckpt {

const char* version() { return DISTCKPT_VERSION_STRING; }

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kAuthFailed: return "authentication failed";
    case StatusCode::kMismatch: return "mismatch";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kAlreadyExists: return "already exists";
    case StatusCode::kBusy: return "busy";
    case StatusCode::kAborted: return "aborted";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace distckpt
