// References between checkpoints of one root (incremental saves) and how their files
// are freed. A checkpoint's index may list a data file of another checkpoint of the
// same root (File.checkpoint): its unchanged chunks stay where an earlier save wrote
// them. What keeps such a file is decided from the indexes themselves, never from
// counts kept beside them, so a crash can neither leak a file for good nor free one
// that is still referenced:
//
//   A data file <root>/<c>/<f> is live while
//     - <c> is committed (its index.pb exists), or
//     - a committed checkpoint's index lists the reference (c, f), or
//     - a save in flight lists "c/f" in the `references` file of its temporary entry
//       (written before it writes any data).
//
// What reads or changes references in a root holds the root's "references" lock
// (lock_references): a save choosing its base, an incremental commit, a best copy's
// commit, a retirement and a sweep. So a retirement never reads what is live while a
// referencing checkpoint commits or another one retires.
//
// Retiring a checkpoint (retire_checkpoint), under the lock:
//   1. renames its index.pb to index.retired and fsyncs: from here it is not listed,
//      loaded or taken as a base;
//   2. a checkpoint that no save ever took as its base (no `referenced` marker, which
//      prepare_base writes before its references file) has no referenced file: it is
//      renamed to "<name>.tmp-deleting-<id>" and removed, as before references existed;
//   3. otherwise it reads what is live (every committed index and every in-flight
//      references file) and removes each of its files that is not; when none is left the
//      directory goes too.
// A retired checkpoint whose files are still referenced stays as a directory holding
// index.retired (which readers use to check the references' identity) and those files:
// `ls` shows it as "retired", with what it keeps; sweep_retired (run by the manager's
// retention and by gc) frees them once nothing references them. A crash at any step
// leaves a state the next sweep finishes.
//
// A save that references files (collective/incremental.h), under the lock, marks its
// base, writes its references file, then checks that its base is still the committed
// checkpoint it read; at commit, under the lock again, it checks that every file it
// references exists (a real directory, the recorded size). Assumes a file system whose
// metadata operations are seen in order by every client (POSIX; NFS with attribute
// caching does not guarantee it).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "catalog/claims.h"
#include "distckpt/filesystem.h"
#include "distckpt/status.h"
#include "format/native/file_names.h"

namespace distckpt::internal_catalog {

// In a temporary entry: the files an in-flight save may reference, "<checkpoint>/<file>"
// per line.
inline constexpr const char* kReferencesFile = "references";
inline constexpr const char* kRetiredIndexFile = internal_format::kRetiredIndexFileName;
inline constexpr const char* kReferencedMarker = internal_format::kReferencedMarkerName;

// The root's "references" lock (see above). kAborted after 30 s held by a live owner.
Result<std::unique_ptr<RootLock>> lock_references(FileSystem& fs, const std::string& root);

// Writes the `referenced` marker into <root>/<name> (a committed checkpoint), durably.
Status mark_referenced(FileSystem& fs, const std::string& root, const std::string& name);

// "<checkpoint>/<file>".
std::string reference_key(const std::string& checkpoint, const std::string& file);

// Writes `files` (reference_key strings) as <tmp_dir>/references, atomically (a
// temporary name, fsynced, renamed, directory fsynced when `fsync`).
Status write_references(FileSystem& fs, const std::string& tmp_dir, const std::set<std::string>& files, bool fsync);

struct LiveFiles {
  std::set<std::string> files;  // reference_key of every referenced file
  // Entries whose references could not be read (a damaged index, an unreadable
  // references file): while there is one, no file of a retired checkpoint is freed.
  std::vector<std::string> unknown;
};
// What is referenced in `root` now (see the top of this file). Errors: listing the root.
Result<LiveFiles> live_files(FileSystem& fs, const std::string& root);

// Whether <root>/<name> is a retired checkpoint that still holds files.
bool is_retired_entry(FileSystem& fs, const std::string& root, const std::string& name);

struct SweepReport {
  std::vector<std::string> removed;   // retired checkpoints now gone
  std::vector<std::string> kept;      // retired checkpoints still holding referenced files
  uint64_t kept_files = 0, kept_bytes = 0;
  std::vector<std::string> warnings;  // why some could not be freed
};
// Frees what no checkpoint references of every retired checkpoint in `root`, under the
// lock. Local, one process (rank 0 of a manager, the gc command). Errors: listing the
// root, the lock. With `dry_run`: removes nothing; `removed` lists the retired
// checkpoints that would go entirely (the files of those kept are counted all the same).
Result<SweepReport> sweep_retired(FileSystem& fs, const std::string& root, bool dry_run = false);

}  // namespace distckpt::internal_catalog
