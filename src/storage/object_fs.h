// s3://bucket/key paths as a FileSystem, for everything that reads checkpoints and for a
// save's data files: a file is an object, a directory a key prefix ending in '/'.
//
// What an object store cannot do is refused, never emulated: rename, link and append
// (kUnsupported), and create_dir, whose atomicity claims and locks rely on (a prefix
// cannot be created; create_dirs succeeds, as prefixes need no creating). The object
// catalog (catalog/object_root.h) commits with conditional writes instead of renames.
//
// A writable file is written once, front to back (writes past the end wait in memory
// until the gap before them is filled; a write into bytes already sent is refused). Its
// bytes go in parts of ObjectStore::part_bytes() as they fill (a multipart upload), and
// the object appears whole at sync() or close(): never partly. list_dir of a prefix with
// nothing under it is an empty directory (kNotFound only for a missing bucket). remove_all
// of a prefix also aborts the incomplete multipart uploads under it. A readable file is the
// object's version at open (reads of a later version fail, kAborted).
#pragma once

#include <memory>
#include <string>

#include "distckpt/filesystem.h"
#include "storage/object_store.h"

namespace distckpt::internal_storage {

// The process-wide file system of s3:// paths, each bucket's store from object_store_for
// (never null, thread-safe).
std::shared_ptr<FileSystem> object_filesystem();

// The file system for `path`: `given` when set, else the object file system for an s3://
// path and the POSIX one for the rest. Never null.
std::shared_ptr<FileSystem> filesystem_for(const std::string& path, std::shared_ptr<FileSystem> given);

// The key of an s3://bucket/key path within its bucket ("" for the bucket itself).
std::string object_key(const std::string& path);

}  // namespace distckpt::internal_storage
