#pragma once

#include <cstdint>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_runtime {

// The commit sequence number for the next save under `root`: 1 + that of `latest`'s
// target, or 1 + the highest among committed checkpoints when there is no valid
// pointer (first save, pointer lost). Rank 0 only.
uint64_t next_commit_seq(FileSystem& fs, const std::string& root);

// The `latest` pointer's content: one checkpoint name (validate_checkpoint_name),
// optionally followed by a newline; "" for anything else (a missing, damaged or hostile
// pointer means "no pointer": resolution falls back to the committed checkpoints).
constexpr std::size_t kMaxLatestBytes = 4096;
std::string parse_latest_pointer(std::string text);

}  // namespace distckpt::internal_runtime
