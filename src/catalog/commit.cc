// The commit protocol: the one rule that must never break.
//
//  1. Every rank writes its data files into <root>/<name>.tmp-<id>/ (save.cc).
//  2. Each writer fsyncs its files; all ranks agree on success (one collective). Any
//     failure: every rank returns that error, rank 0 removes the tmp directory.
//  3. Rank 0 writes index.pb into the tmp directory and fsyncs it, fsyncs the tmp
//     directory (so the data files' entries are durable), renames it to <root>/<name>
//     and fsyncs <root>: from here the checkpoint exists.
//  4. Rank 0 moves <root>/latest: write latest.tmp-<id>, fsync, rename over latest,
//     fsync <root>. A failure here leaves a committed checkpoint and an older pointer,
//     which readers tolerate (resolve_checkpoint picks the newest commit), so it is
//     reported as a warning, not an error.
//  5. Ranks agree on the commit's outcome; retention (manager) runs only after it.
//
// A checkpoint exists if and only if its final-named directory exists with a valid
// index; leftover .tmp-* directories are garbage and are never listed or loaded.
#include "catalog/commit.h"

#include <chrono>
#include <cstdio>
#include <random>

#include "format/native/index_io.h"

namespace distckpt::internal_runtime {

std::string make_tmp_dir_name(const std::string& root, const std::string& name) {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
  return root + "/" + name + internal_storage::kTmpMarker + hex;
}

Result<CommitResult> commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_dir,
                                       const std::string& name, const proto::Index& index, bool fsync,
                                       bool update_latest) {
  CommitResult result;
  // Step 3: index, fsync, rename, fsync parent.
  const std::string framed = internal_storage::frame_index(index);
  result.index_bytes = framed.size();
  // Never commit what a reader would refuse: parse the exact bytes about to be written.
  Status readable = internal_storage::parse_index(framed, tmp_dir + "/" + internal_storage::kIndexFileName).status();
  if (!readable.ok()) return internal_error("commit: the index would not be readable: " + readable.to_string());
  {
    DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp_dir + "/" + internal_storage::kIndexFileName));
    DISTCKPT_RETURN_IF_ERROR(file->write_at(framed.data(), framed.size(), 0));
    if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
    DISTCKPT_RETURN_IF_ERROR(file->close());
  }
  if (fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(tmp_dir));
  DISTCKPT_ASSIGN_OR_RETURN(CommitResult published, publish_checkpoint(fs, root, tmp_dir, name, fsync, update_latest));
  published.index_bytes = result.index_bytes;
  return published;
}

Result<CommitResult> publish_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
                                        const std::string& name, bool fsync, bool update_latest) {
  CommitResult result;
  const std::string final_dir = root + "/" + name;
  const std::string& tmp_dir = tmp_path;
  // No-replace: another job that committed the same name meanwhile keeps its checkpoint.
  Status renamed = fs.rename_no_replace(tmp_dir, final_dir);
  if (renamed.code() == StatusCode::kAlreadyExists)
    return already_exists("commit: '" + final_dir + "' appeared during the save");
  DISTCKPT_RETURN_IF_ERROR(renamed);
  if (fsync) {
    Status st = fs.sync_dir(root);
    if (!st.ok()) {
      // The rename may not be durable: undo it so that no rank reports failure for a
      // checkpoint that is visible. If even the undo fails, the checkpoint is complete
      // (data, index and its directory are fsynced) and visible: report it as committed,
      // with a warning, rather than as a failure nobody can act on.
      if (fs.rename(final_dir, tmp_dir).ok()) return st;
      result.warning = "checkpoint '" + final_dir + "' is committed but its directory entry may not be durable: " +
                       st.to_string();
    }
  }

  // Step 4: move the latest pointer atomically.
  if (update_latest) {
    const std::string tmp_latest = make_tmp_dir_name(root, internal_storage::kLatestFileName);
    Status st = [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp_latest));
      const std::string text = name + "\n";
      DISTCKPT_RETURN_IF_ERROR(file->write_at(text.data(), text.size(), 0));
      if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
      DISTCKPT_RETURN_IF_ERROR(file->close());
      DISTCKPT_RETURN_IF_ERROR(fs.rename(tmp_latest, root + "/" + internal_storage::kLatestFileName));
      if (fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(root));
      return Status();
    }();
    if (!st.ok()) {
      (void)fs.remove_file(tmp_latest);
      result.warning += (result.warning.empty() ? "" : "; ") + ("checkpoint '" + final_dir +
                        "' is committed but the latest pointer was not moved: " + st.to_string());
    }
  }
  return result;
}

}  // namespace distckpt::internal_runtime
