// Whether a directory is on a memory file system (tmpfs, ramfs): there the page cache is
// the storage, so O_DIRECT brings nothing (a direct write only adds the staging copy) and
// replicas that read the same bytes share no storage read.
#pragma once

#include <string>

namespace distckpt::internal_storage {

// statfs of `dir` ("." when empty); false when it fails. Any thread.
bool in_memory_file_system(const std::string& dir);

}  // namespace distckpt::internal_storage
