// Listing a root, and what "newer" means in it (local, read-only). The public calls
// (list_checkpoints, resolve_checkpoint) are implemented in listing.cc too.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "distckpt/inspect.h"
#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

// The lowest commit sequence number the committed checkpoints under `root` leave free:
// 1 + that of `latest`'s target, or 1 + the highest among committed checkpoints when
// there is no valid pointer (first save, pointer lost). A save takes its number from
// claim_commit_seq (claims.h), which also counts numbers handed out to saves still in
// flight. Rank 0 only.
uint64_t next_commit_seq(FileSystem& fs, const std::string& root);

// The `latest` pointer's content: one checkpoint name (validate_checkpoint_name),
// optionally followed by a newline; "" for anything else (a missing, damaged or hostile
// pointer means "no pointer": resolution falls back to the committed checkpoints).
constexpr std::size_t kMaxLatestBytes = 4096;
std::string parse_latest_pointer(std::string text);
// The target of <root>/latest, or "" (parse_latest_pointer).
std::string read_latest_pointer(FileSystem& fs, const std::string& root);

// The one ordering of "newer" among committed checkpoints of a root: a higher commit
// sequence number, then (equal numbers: two saves that read the same predecessor) the
// target of `latest`, then the later commit time, then the higher step. Independent of
// clocks unless sequence numbers tie.
bool newer(const CheckpointEntry& a, const CheckpointEntry& b, const std::string& latest);

}  // namespace distckpt::internal_catalog
