// Opening any checkpoint for reading: a native checkpoint directory (index.pb) or a
// single file of a single-file format, through the format table (format.h).
#pragma once

#include <string>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// The description of the checkpoint at `path` (a directory or a file), validated
// (validate_index). kNotFound, kCorruption, kUnsupported, kIoError.
Result<proto::Index> read_stored_index(FileSystem& fs, const std::string& path);

}  // namespace distckpt::internal_format
