// The commit protocol: the one rule that must never break.
//
//  1. Every rank writes its data files into <root>/<name>.tmp-<id>/ (collective/save.cc).
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

#include "catalog/listing.h"
#include "catalog/names.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_catalog {

using internal_format::kIndexFileName;

Result<CommitResult> commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_dir,
                                       const std::string& name, const proto::Index& index, bool fsync,
                                       bool update_latest) {
  CommitResult result;
  // Step 3: index, fsync, rename, fsync parent.
  const std::string framed = internal_format::frame_index(index);
  result.index_bytes = framed.size();
  // Never commit what a reader would refuse: parse the exact bytes about to be written.
  Status readable = internal_format::parse_index(framed, tmp_dir + "/" + kIndexFileName).status();
  if (!readable.ok()) return internal_error("commit: the index would not be readable: " + readable.to_string());
  {
    DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp_dir + "/" + kIndexFileName));
    DISTCKPT_RETURN_IF_ERROR(file->write_at(framed.data(), framed.size(), 0));
    if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
    DISTCKPT_RETURN_IF_ERROR(file->close());
  }
  if (fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(tmp_dir));
  DISTCKPT_ASSIGN_OR_RETURN(CommitResult published, install_checkpoint(fs, root, tmp_dir, name, fsync, update_latest));
  published.index_bytes = result.index_bytes;
  return published;
}

Result<CommitResult> install_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
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
    const std::string tmp_latest = make_tmp_name(root, kLatestFileName);
    Status st = [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp_latest));
      const std::string text = name + "\n";
      DISTCKPT_RETURN_IF_ERROR(file->write_at(text.data(), text.size(), 0));
      if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
      DISTCKPT_RETURN_IF_ERROR(file->close());
      DISTCKPT_RETURN_IF_ERROR(fs.rename(tmp_latest, root + "/" + kLatestFileName));
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

Result<Entry> begin_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                          const std::string& who) {
  Entry entry;
  entry.path = root + "/" + name;
  entry.directory = directory;
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root).with_context(who));
  if (fs.exists(entry.path)) return already_exists(who + ": checkpoint '" + entry.path + "' already exists");
  entry.commit_seq = next_commit_seq(fs, root);
  entry.tmp = make_tmp_name(root, name);
  if (directory) DISTCKPT_RETURN_IF_ERROR(fs.create_dir(entry.tmp).with_context(who));
  return entry;
}

Result<CommitResult> finish_entry(FileSystem& fs, const std::string& root, const Entry& entry,
                                  const proto::Index* index, bool fsync, bool update_latest) {
  const std::string name = entry.path.substr(root.size() + 1);
  Result<CommitResult> committed = internal_error("commit: a checkpoint directory without its index");
  if (!entry.directory) committed = install_checkpoint(fs, root, entry.tmp, name, fsync, update_latest);
  else if (index != nullptr) committed = commit_checkpoint(fs, root, entry.tmp, name, *index, fsync, update_latest);
  // Our tmp entry still exists unless the rename happened: remove it (garbage).
  if (!committed.ok() && fs.exists(entry.tmp)) discard_entry(fs, entry);
  return committed;
}

void discard_entry(FileSystem& fs, const Entry& entry) {
  if (entry.directory) (void)fs.remove_all(entry.tmp);
  else (void)fs.remove_file(entry.tmp);
}

}  // namespace distckpt::internal_catalog
