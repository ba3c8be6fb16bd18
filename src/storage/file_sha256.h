// The SHA-256 of a file (content-addressed publishing).
#pragma once

#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_storage {

// Local, thread-safe. The SHA-256 of the file at `path` as 64 lowercase hex digits, read
// in 8 MiB pieces. Errors: the file system's (kNotFound, kIoError), kInternal if OpenSSL
// fails, each naming the path.
Result<std::string> sha256_file(FileSystem& fs, const std::string& path);

}  // namespace distckpt::internal_storage
