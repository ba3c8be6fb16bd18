// Spare files: the files of a removed checkpoint kept on a node for the next save to
// overwrite. Writing into pages a file already has is faster than into new ones (tmpfs
// allocates every new page; measured in docs/guide/tiers.md "Surviving node loss"), and the node's
// memory peaks no higher than without them: a save turns the spares into its own files
// as it writes, so spares plus checkpoints never exceed the checkpoints kept plus the
// one being written.
//
// A spare is never read as data: a save that takes one sizes it to its own file and
// overwrites every byte it keeps. Spares live in a directory of their own (the local
// tier's <dir>/.distckpt-spare); none of them is referenced by any index or record.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_storage {

// Moves every regular file under `dir` (recursively) into `spare_dir`, after removing
// whatever `spare_dir` held (so spares never exceed one checkpoint's files), then removes
// `dir`. Best effort, as a removal is: what cannot be moved is removed.
Status retire_into_spares(FileSystem& fs, const std::string& dir, const std::string& spare_dir);

// Renames a regular file of `spare_dir` to `path` (which must not exist), the one that
// best fits a file of `size` bytes. Only from an owner-only directory of this user, and
// only a file of this user with one link. False when there is none to take: the caller writes
// a new file. Several writers may take spares from one directory at once; each gets its
// own.
bool take_spare(FileSystem& fs, const std::string& spare_dir, const std::string& path, uint64_t size);

// Removes `spare_dir` and what it holds (a job that ends gives the memory back).
void drop_spares(FileSystem& fs, const std::string& spare_dir);

}  // namespace distckpt::internal_storage
