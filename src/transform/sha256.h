// SHA-256 through OpenSSL's EVP interface (content-addressed publishing; a file's digest:
// storage/file_sha256.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "distckpt/status.h"

namespace distckpt::internal_transform {

// A digest computed piece by piece. One thread at a time; kInternal if OpenSSL fails.
class Sha256 {
 public:
  static Result<Sha256> start();
  Status update(const void* data, std::size_t n);
  // The digest as 64 lowercase hex digits; the object is spent.
  Result<std::string> finish_hex();

 private:
  struct Ctx;
  explicit Sha256(std::shared_ptr<Ctx> ctx) : ctx_(std::move(ctx)) {}
  std::shared_ptr<Ctx> ctx_;
};

// The digest of `n` bytes at `data` as hex; "" if OpenSSL fails.
std::string sha256_hex(const void* data, std::size_t n);

}  // namespace distckpt::internal_transform
