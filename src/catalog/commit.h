// The commit protocol (the steps are written at the top of commit.cc), and the local
// frame of every save: a temporary entry in the root, then its commit under its name.
#pragma once

#include <string>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_catalog {

struct CommitResult {
  uint64_t index_bytes = 0;
  std::string warning;  // non-fatal: the checkpoint is committed but `latest` was not moved
};

// Rank 0 only, after every rank's data files are fsynced and all ranks agreed.
// Performs steps 3 and 4 of the protocol described in commit.cc. On error the final
// name does not exist (unless the error is reported as a warning).
Result<CommitResult> commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_dir,
                                       const std::string& name, const proto::Index& index, bool fsync,
                                       bool update_latest);

// Rank 0 only: the rename and pointer part of step 3 and step 4, for a checkpoint
// (a directory with its index, or a single file) complete and fsynced at `tmp_path`.
Result<CommitResult> install_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
                                        const std::string& name, bool fsync, bool update_latest);

// ---- the local frame (rank 0 of a save, or a local tool) ----

struct Entry {
  std::string path;        // <root>/<name>: where it will be committed
  std::string tmp;         // <root>/<name>.tmp-<id>: what is written now
  bool directory = false;  // a checkpoint directory (else a single file)
  uint64_t commit_seq = 0;  // the sequence number it will be committed with
};
// Creates `root` if missing, refuses a taken name (kAlreadyExists), numbers the entry
// (next_commit_seq) and, for a directory, creates its tmp directory. Errors name `who`.
Result<Entry> begin_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                          const std::string& who);
// Commits a written and fsynced entry: a directory with `index` written into it
// (commit_checkpoint; `index` must be given), or a single file (install_checkpoint).
// On failure the tmp entry is removed if it is still there (never the final name).
Result<CommitResult> finish_entry(FileSystem& fs, const std::string& root, const Entry& entry,
                                  const proto::Index* index, bool fsync, bool update_latest);
// Removes an entry that will not be committed (best effort: leftovers are garbage).
void discard_entry(FileSystem& fs, const Entry& entry);

}  // namespace distckpt::internal_catalog
