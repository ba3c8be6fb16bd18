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
// Retiring a checkpoint (retire_checkpoint):
//   1. renames its index.pb to index.retired and fsyncs: from here it is not listed,
//      loaded or taken as a base, and no new save can start referencing its files;
//   2. reads what is live (every committed index and every in-flight references file);
//   3. removes each of its files that is not live; when none is left it goes entirely.
// A retired checkpoint whose files are still referenced stays as a directory holding
// index.retired and those files only: `ls` shows it as "retired", with what it keeps;
// sweep_retired (run by the manager's retention and by gc) frees them once nothing
// references them. A crash at any step leaves a state the next sweep finishes.
//
// A save that references files (collective/incremental.h) writes its references file,
// then checks that its base is still committed: a base retired before that check fails
// the save cleanly; one retired after it sees the references file in step 2. At commit
// the save checks again that every file it references exists.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "distckpt/filesystem.h"
#include "distckpt/status.h"

namespace distckpt::internal_catalog {

// In a temporary entry: the files an in-flight save may reference, "<checkpoint>/<file>"
// per line.
inline constexpr const char* kReferencesFile = "references";
// In a retired checkpoint: its index, kept to describe what the directory still holds.
inline constexpr const char* kRetiredIndexFile = "index.retired";

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
// Frees what no checkpoint references of every retired checkpoint in `root`. Local,
// one process (rank 0 of a manager, the gc command). Errors: listing the root.
Result<SweepReport> sweep_retired(FileSystem& fs, const std::string& root);

}  // namespace distckpt::internal_catalog
