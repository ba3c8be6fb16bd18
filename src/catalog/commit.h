// The commit protocol (the steps are written at the top of commit.cc), and the local
// frame of every save: a temporary entry in the root, then its commit under its name.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "catalog/owner.h"
#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_catalog {

struct CommitResult {
  uint64_t index_bytes = 0;
  // Non-fatal: the checkpoint is committed, but `latest` was not moved or the directory
  // entry may not be durable yet.
  std::string warning;
};

// How a commit moves `latest` (step 4), and what it checks before its rename.
struct LatestUpdate {
  bool update = true;       // move it at all (false: a side snapshot)
  uint64_t commit_seq = 0;  // the checkpoint's: `latest` moves only forward in it
  // Optional, called right before the rename into place: a lock the commit relies on is
  // still this process's (RootLock::still_held); an error fails the commit cleanly.
  std::function<Status()> before_rename;
};

// Rank 0 only, after every rank's data files are fsynced and all ranks agreed.
// Performs steps 3 and 4 of the protocol described in commit.cc for the checkpoint
// directory `tmp_dir`. On error the final name does not exist (unless the error is
// reported as a warning).
Result<CommitResult> commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_dir,
                                       const std::string& name, const proto::Index& index, bool fsync,
                                       const LatestUpdate& latest);

// Rank 0 only: the rename and pointer part of step 3 and step 4, for a checkpoint (a
// directory with its index, or a single file) complete and fsynced at `tmp_path`.
Result<CommitResult> install_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
                                        const std::string& name, bool fsync, const LatestUpdate& latest);

// ---- the local frame (rank 0 of a save, or a local tool) ----

// A save's temporary entry: always a directory <root>/<name>.tmp-<id>/ holding its
// owner's record and heartbeat (owner.h), and either the checkpoint directory's files
// or the single file <name> being written.
struct Entry {
  std::string root;
  std::string name;
  std::string path;        // <root>/<name>: where it will be committed
  std::string tmp;         // <root>/<name>.tmp-<id>: the temporary directory
  bool directory = false;  // a checkpoint directory (else the single file target())
  uint64_t commit_seq = 0;  // the number it will be committed with (claimed: claims.h)
  // An object root's save (object_root.h): "s-<id>", the prefix under <root>/<name>/ that
  // `tmp` names and the index's data file names begin with; empty on a file system.
  std::string data_dir;
  // Refreshes the heartbeat while the entry is written (on the process that made it).
  std::shared_ptr<Heartbeat> heartbeat;
  // LatestUpdate::before_rename of its commit (finish_entry).
  std::function<Status()> before_rename;
  // What the writers write: the directory itself, or the single file in it.
  std::string target() const { return directory ? tmp : tmp + "/" + name; }
};
// Creates `root` if missing, refuses a taken name (kAlreadyExists: a checkpoint, or a
// local tier record of that name unless `drain_of_record`: the drain is how a record's
// name reaches the root), claims the entry's commit sequence number and makes its
// temporary directory with this process's owner record; for a single file, creates the
// file (owner-only) for the writers. Starts the heartbeat when `fs_owner` is given (the
// shared handle the heartbeat thread keeps). Errors name `who`.
Result<Entry> begin_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                          const std::string& who, std::shared_ptr<FileSystem> fs_owner = nullptr,
                          bool drain_of_record = false);
// The temporary directory alone (begin_entry without the name check and the claim):
// for a file whose final name is decided later (publish names it by its digest).
Result<Entry> make_tmp_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                             const std::string& who, std::shared_ptr<FileSystem> fs_owner = nullptr);
// Commits a written and fsynced entry: a directory with `index` written into it
// (commit_checkpoint; `index` must be given), or a single file (install_checkpoint).
// On failure the temporary entry is removed if it is still there (never the final
// name). The heartbeat stops first.
Result<CommitResult> finish_entry(FileSystem& fs, const Entry& entry, const proto::Index* index, bool fsync,
                                  bool update_latest);
// An object root's entry (entry.data_dir set): prefixes the index's own data file names
// with it, where the writers put them; before the index is sealed. No-op otherwise.
void name_files_under_entry(const Entry& entry, proto::Index* index);
// Removes an entry that will not be committed (best effort: leftovers are collected by
// gc.h since the owner record goes last).
void discard_entry(FileSystem& fs, const Entry& entry);

}  // namespace distckpt::internal_catalog
