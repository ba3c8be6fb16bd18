#pragma once

#include <cstdint>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_runtime {

// The commit sequence number for the next save under `root`: 1 + that of `latest`'s
// target, or 1 + the highest among committed checkpoints when there is no valid
// pointer (first save, pointer lost). Rank 0 only.
uint64_t next_commit_seq(FileSystem& fs, const std::string& root);

}  // namespace distckpt::internal_runtime
