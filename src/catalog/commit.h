#pragma once

#include <string>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_runtime {

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
Result<CommitResult> publish_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
                                        const std::string& name, bool fsync, bool update_latest);

// A fresh "<root>/<name>.tmp-<random hex>" path.
std::string make_tmp_dir_name(const std::string& root, const std::string& name);

}  // namespace distckpt::internal_runtime
