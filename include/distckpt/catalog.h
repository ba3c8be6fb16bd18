/// A root directory's checkpoints: list them, find the newest, remove one as retention
/// does. Local (one process, no communicator) and thread-safe. inspect.h includes it.
///
/// Every call takes the file system and, for encrypted checkpoints, the key in its
/// options struct (InspectOptions), as every options struct of distckpt does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/status.h"

namespace distckpt {

struct InspectOptions {
  std::shared_ptr<FileSystem> fs = nullptr;  ///< null: POSIX
  /// The key of an encrypted checkpoint (describing its tensors, verifying its chunks).
  /// With a key, a checkpoint that is not encrypted is refused (kAuthFailed): a plain
  /// checkpoint in an encrypted one's place is a downgrade.
  std::shared_ptr<const EncryptionKey> key = nullptr;
};

/// kCommitted: a checkpoint. kInFlight: a save in progress or abandoned (.tmp-*).
/// kBroken: damaged (empty, truncated, a bad index). kForeign: a file with a checkpoint
/// format's extension whose contents are not that format (a zip, a pickle, text): never
/// resumed from, retained or removed.
/// kRetired: a retired checkpoint that still holds data files other checkpoints
/// reference (incremental saves); not loadable, freed once nothing references them.
enum class EntryState { kCommitted, kInFlight, kBroken, kForeign, kRetired };
struct CheckpointEntry {
  std::string name;
  EntryState state = EntryState::kBroken;
  /// Why broken, in flight, foreign or retired; for a committed one, a warning or "" (its
  /// data carries no checksums: "unchecked: structure only: ..."; a per-rank set without
  /// a MindSpore strategy file: "no MindSpore strategy: tensor 'x': ...").
  std::string detail;
  int64_t step = -1, epoch = -1;
  /// Data bytes in the entry's own files (committed and retired entries). An incremental
  /// checkpoint's unchanged chunks are in files of earlier checkpoints: their sizes are in
  /// referenced_bytes, those checkpoints' names in `references`.
  uint64_t bytes = 0;
  uint64_t referenced_bytes = 0;
  std::vector<std::string> references;
  Format format = Format::kNative;
  bool per_rank_files = false;  ///< a per-rank .ckpt set, listed as one checkpoint
  int64_t created_unix_ms = 0;
  uint64_t commit_seq = 0;       ///< see resolve_checkpoint
  bool advances_latest = false;  ///< saved with update_latest
  /// A .ckpt encrypted whole, listed without its key: its step, epoch and commit order are
  /// inside it (unknown here); resolve_checkpoint takes it only when `latest` names it.
  bool sealed = false;
};
struct RootListing {
  std::vector<CheckpointEntry> entries;  ///< committed ordered by (step, created), others after
  std::string latest;                    ///< target of <root>/latest, empty when none/invalid
};
/// Lists the entries under `root`: committed checkpoints, in-flight (.tmp-*) and broken
/// ones (no valid description, with the reason in `detail`), each reported as such;
/// reads every index (no key needed). kNotFound if `root` does not exist; kIoError if
/// it cannot be listed. Damaged checkpoints are reported as entries, not as errors.
Result<RootListing> list_checkpoints(const std::string& root, const InspectOptions& options = {});

/// If `path` is a checkpoint (a directory with an index, or a single file), returns it.
/// If it is a root, returns the newest committed checkpoint among those saved with
/// update_latest (all committed ones if none was): the highest commit sequence number,
/// ties going to the `latest` pointer's target, then to the later commit time. The
/// sequence number (claimed at save time above every committed checkpoint's, `latest`'s
/// target's and every number handed out before) makes this independent
/// of clocks, and a crash between the rename and the pointer update (which leaves
/// `latest` one behind) still resumes from the newer checkpoint. kNotFound when there is
/// none (naming damaged directories, if any); kCorruption when `latest` names a damaged
/// checkpoint, so that a job never falls back to an older one silently; I/O errors of
/// the listing.
Result<std::string> resolve_checkpoint(const std::string& path, const InspectOptions& options = {});

/// Removes the committed checkpoint `name` of `root` the way the manager's retention does
/// (src/catalog/references.h): it stops being listed at once; its files go, except those
/// later checkpoints reference (incremental saves), which stay, listed as "retired", until
/// nothing references them. Never `rm -rf` a checkpoint directory of a root with
/// incremental saves: later checkpoints may read its files. Local, one process, any
/// thread. kNotFound if there is no such committed checkpoint; kInvalidArgument for a
/// name that cannot be a checkpoint's; errors of the file system.
Status remove_checkpoint(const std::string& root, const std::string& name, const InspectOptions& options = {});

}  // namespace distckpt
