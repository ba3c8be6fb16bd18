// Listing a root, and what "newer" means in it (local, read-only). The public calls
// (list_checkpoints, resolve_checkpoint) are implemented in listing.cc too.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "distckpt/catalog.h"
#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

// 1 + the commit sequence number of `latest`'s target, or of the highest committed
// checkpoint when there is no valid pointer (first save, pointer lost): the floor that
// claim_commit_seq (claims.h), where a save takes its number, raises with its counter of
// numbers handed out. Rank 0 only.
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
