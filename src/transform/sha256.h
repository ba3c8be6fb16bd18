// SHA-256 of a file, through OpenSSL's EVP interface (content-addressed publishing).
#pragma once

#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_transform {

// Local, thread-safe. The SHA-256 of the file at `path` as 64 lowercase hex digits,
// read in 8 MiB pieces. Errors: the file system's (kNotFound, kIoError), kInternal if
// OpenSSL fails.
Result<std::string> sha256_file(FileSystem& fs, const std::string& path);

// The digest of `n` bytes at `data` as hex; "" if OpenSSL fails.
std::string sha256_hex(const void* data, std::size_t n);

}  // namespace distckpt::internal_transform
