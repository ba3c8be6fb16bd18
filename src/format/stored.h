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

// What listing and ordering need (step, epoch, commit order, files), validated: the
// description, except for a .ckpt encrypted whole and opened with its key, whose
// metadata alone is read (describing its records would decrypt every block). Same errors.
Result<proto::Index> read_stored_summary(FileSystem& fs, const std::string& path);

}  // namespace distckpt::internal_format
