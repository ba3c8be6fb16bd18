// The commit protocol: the one rule that must never break.
//
//  1. Every rank writes its data files into <root>/<name>.tmp-<id>/ (collective/save.cc);
//     a single file is written as <root>/<name>.tmp-<id>/<name>. The temporary directory
//     holds its owner's record from the start (owner.h), so that an abandoned save is
//     collected only when its owner is provably gone (gc.h).
//  2. Each writer fsyncs its files; all ranks agree on success (one collective). Any
//     failure: every rank returns that error, rank 0 removes the tmp directory.
//  3. Rank 0 writes index.pb into the tmp directory and fsyncs it, fsyncs the tmp
//     directory (so the data files' entries are durable), renames it to <root>/<name>
//     without replacing anything and fsyncs <root>: from here the checkpoint exists. (A
//     single file is renamed out of its tmp directory the same way.) The owner record
//     left in a committed directory is removed after the rename; a crash leaves it there,
//     harmless.
//  4. Rank 0 moves <root>/latest, under the root's latest lock (claims.h) and only forward
//     in commit sequence: write latest.tmp-<id>, fsync, rename over latest, fsync <root>.
//     A failure here leaves a committed checkpoint and an older pointer, which readers
//     tolerate (resolve_checkpoint picks the highest sequence number), so it is reported
//     as a warning, not an error; the checkpoint is never removed to "roll back".
//  5. Ranks agree on the commit's outcome; retention (manager) runs only after it.
//
// A checkpoint exists if and only if its final-named directory (or file) exists with a
// valid index; leftover .tmp-* entries are garbage and are never listed or loaded.
#include "catalog/commit.h"

#include "base/kill_point.h"
#include "catalog/claims.h"
#include "catalog/listing.h"
#include "catalog/names.h"
#include "catalog/object_root.h"
#include "catalog/references.h"
#include "format/native/index_codec.h"
#include "format/stored.h"

namespace distckpt::internal_catalog {

using internal_format::kIndexFileName;

namespace {

// How long a commit waits for another job's pointer update.
constexpr double kLatestLockTimeout = 30;

// Step 4, under the lock: `latest` moves to `name` unless it names a checkpoint with a
// higher commit sequence number already.
Status move_latest(FileSystem& fs, const std::string& root, const std::string& name, uint64_t commit_seq,
                   bool fsync) {
  DISTCKPT_ASSIGN_OR_RETURN(auto lock, RootLock::acquire(fs, root, "latest", kLatestLockTimeout));
  const std::string current = read_latest_pointer(fs, root);
  if (!current.empty() && current != name) {
    auto index = internal_format::read_stored_summary(fs, root + "/" + current);
    if (index.ok() && index->commit_seq() > commit_seq) return Status();  // a later save's: keep it
  }
  const std::string tmp_latest = make_owned_tmp_name(root, kLatestFileName);
  Status st = [&]() -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp_latest));
    const std::string text = name + "\n";
    DISTCKPT_RETURN_IF_ERROR(file->write_at(text.data(), text.size(), 0));
    if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
    DISTCKPT_RETURN_IF_ERROR(file->close());
    DISTCKPT_RETURN_IF_ERROR(lock->still_held());  // else another commit may be moving it
    DISTCKPT_RETURN_IF_ERROR(fs.rename(tmp_latest, root + "/" + kLatestFileName));
    if (fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(root));
    return Status();
  }();
  if (!st.ok()) (void)fs.remove_file(tmp_latest);
  return st;
}

// Removes what only the temporary directory needed (best effort).
void drop_owner_files(FileSystem& fs, const std::string& dir) {
  (void)fs.remove_file(dir + "/" + kHeartbeatFile);
  (void)fs.remove_file(dir + "/" + kOwnerFile);
  (void)fs.remove_file(dir + "/" + kReferencesFile);  // the index lists what it references now
}

}  // namespace

Result<CommitResult> commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_dir,
                                       const std::string& name, const proto::Index& index, bool fsync,
                                       const LatestUpdate& latest) {
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
  DISTCKPT_ASSIGN_OR_RETURN(CommitResult published, install_checkpoint(fs, root, tmp_dir, name, fsync, latest));
  drop_owner_files(fs, root + "/" + name);
  published.index_bytes = result.index_bytes;
  return published;
}

Result<CommitResult> install_checkpoint(FileSystem& fs, const std::string& root, const std::string& tmp_path,
                                        const std::string& name, bool fsync, const LatestUpdate& latest) {
  CommitResult result;
  const std::string final_path = root + "/" + name;
  internal_base::kill_point("commit-rename");
  if (latest.before_rename) DISTCKPT_RETURN_IF_ERROR(latest.before_rename());
  // No-replace: another job that committed the same name meanwhile keeps its checkpoint.
  Status renamed = fs.rename_no_replace(tmp_path, final_path);
  if (renamed.code() == StatusCode::kAlreadyExists)
    return already_exists("commit: '" + final_path + "' appeared during the save");
  DISTCKPT_RETURN_IF_ERROR(renamed);
  if (fsync) {
    Status st = fs.sync_dir(root);
    if (!st.ok()) {
      // The rename may not be durable: undo it so that no rank reports failure for a
      // checkpoint that is visible. If even the undo fails, the checkpoint is complete
      // (data, index and its directory are fsynced) and visible: report it as committed,
      // with a warning, rather than as a failure nobody can act on.
      if (fs.rename(final_path, tmp_path).ok()) return st;
      result.warning = "checkpoint '" + final_path + "' is committed but its directory entry may not be durable: " +
                       st.to_string();
    }
  }
  // Step 4: move the latest pointer, forward only.
  internal_base::kill_point("commit-latest");
  if (latest.update) {
    Status st = move_latest(fs, root, name, latest.commit_seq, fsync);
    if (!st.ok())
      result.warning += (result.warning.empty() ? "" : "; ") + ("checkpoint '" + final_path +
                        "' is committed but the latest pointer was not moved: " + st.to_string());
  }
  return result;
}

Result<Entry> begin_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                          const std::string& who, std::shared_ptr<FileSystem> fs_owner, bool drain_of_record) {
  if (is_object_root(root)) {
    if (!directory)
      return unsupported(who + ": '" + root + "/" + name + "': an object root holds sharded native checkpoints only "
                         "(a single-file format is committed by a rename, which an object store does not have)");
    return begin_object_entry(fs, root, name, who, std::move(fs_owner));
  }
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root).with_context(who));
  const std::string path = root + "/" + name;
  if (fs.exists(path) && is_retired_entry(fs, root, name))
    return already_exists(who + ": '" + path + "' is a retired checkpoint that keeps data files later checkpoints "
                          "reference (distckpt ls shows it): its name is taken until they are retired");
  if (fs.exists(path)) return already_exists(who + ": checkpoint '" + path + "' already exists");
  if (!drain_of_record && fs.exists(local_record_path(root, name)))
    return already_exists(who + ": checkpoint '" + path + "' already exists at the local tier");
  auto seq = claim_commit_seq(fs, root);
  if (!seq.ok()) return seq.status().with_context(who);
  DISTCKPT_ASSIGN_OR_RETURN(Entry entry, make_tmp_entry(fs, root, name, directory, who, std::move(fs_owner)));
  entry.commit_seq = *seq;
  return entry;
}

Result<Entry> make_tmp_entry(FileSystem& fs, const std::string& root, const std::string& name, bool directory,
                             const std::string& who, std::shared_ptr<FileSystem> fs_owner) {
  Entry entry;
  entry.root = root;
  entry.name = name;
  entry.path = root + "/" + name;
  entry.directory = directory;
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root).with_context(who));
  entry.tmp = make_tmp_name(root, name);
  DISTCKPT_RETURN_IF_ERROR(fs.create_dir(entry.tmp).with_context(who));
  Status made = [&]() -> Status {
    DISTCKPT_RETURN_IF_ERROR(write_owner(fs, entry.tmp, OwnerRecord::self()));
    if (!directory) {  // created owner-only before any writer (HDF5 included) opens it
      DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(entry.target()));
      DISTCKPT_RETURN_IF_ERROR(file->close());
    }
    return Status();
  }();
  if (!made.ok()) {
    discard_entry(fs, entry);
    return made.with_context(who);
  }
  if (fs_owner) entry.heartbeat = std::make_shared<Heartbeat>(std::move(fs_owner), entry.tmp);
  return entry;
}

Result<CommitResult> finish_entry(FileSystem& fs, const Entry& entry, const proto::Index* index, bool fsync,
                                  bool update_latest) {
  if (!entry.data_dir.empty()) {
    if (index == nullptr) return internal_error("commit: an object root's checkpoint without its index");
    return commit_object_entry(fs, entry, *index, update_latest);
  }
  if (entry.heartbeat) entry.heartbeat->stop();
  const LatestUpdate latest{update_latest, entry.commit_seq, entry.before_rename};
  Result<CommitResult> committed = internal_error("commit: a checkpoint directory without its index");
  if (!entry.directory) {
    committed = install_checkpoint(fs, entry.root, entry.target(), entry.name, fsync, latest);
    if (committed.ok()) discard_entry(fs, entry);  // the empty temporary directory
  } else if (index != nullptr) {
    committed = commit_checkpoint(fs, entry.root, entry.tmp, entry.name, *index, fsync, latest);
  }
  // Our tmp entry still exists unless the rename happened: remove it (garbage).
  if (!committed.ok() && fs.exists(entry.tmp)) discard_entry(fs, entry);
  return committed;
}

void name_files_under_entry(const Entry& entry, proto::Index* index) {
  if (entry.data_dir.empty()) return;
  for (proto::File& f : *index->mutable_files())
    if (f.checkpoint().empty() && f.name().find('/') == std::string::npos) f.set_name(entry.data_dir + "/" + f.name());
}

void discard_entry(FileSystem& fs, const Entry& entry) {
  if (entry.heartbeat) entry.heartbeat->stop();
  if (entry.tmp.empty()) return;
  // The owner record last (gc.h): a crash half way leaves an entry a collector can judge.
  if (auto children = fs.list_dir(entry.tmp); children.ok())
    for (const auto& c : *children)
      if (c.name != kOwnerFile) (void)fs.remove_all(entry.tmp + "/" + c.name);
  (void)fs.remove_all(entry.tmp);
}

}  // namespace distckpt::internal_catalog
