#include "catalog/references.h"

#include "base/kill_point.h"
#include "catalog/names.h"
#include "catalog/owner.h"
#include "catalog/retire.h"
#include "format/native/index_codec.h"
#include "format/stored.h"

namespace distckpt::internal_catalog {

namespace {

constexpr uint64_t kMaxReferencesBytes = uint64_t{64} << 20;
constexpr double kReferencesLockTimeout = 30;

bool is_directory_of(FileSystem& fs, const std::string& root, const std::string& name) {
  auto entries = fs.list_dir(root + "/" + name);
  return entries.ok();
}

}  // namespace

std::string reference_key(const std::string& checkpoint, const std::string& file) { return checkpoint + "/" + file; }

Result<std::unique_ptr<RootLock>> lock_references(FileSystem& fs, const std::string& root) {
  return RootLock::acquire(fs, root, "references", kReferencesLockTimeout);
}

Status mark_referenced(FileSystem& fs, const std::string& root, const std::string& name) {
  const std::string dir = root + "/" + name;
  if (fs.exists(dir + "/" + kReferencedMarker)) return Status();
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(dir + "/" + kReferencedMarker));
  DISTCKPT_RETURN_IF_ERROR(file->close());
  return fs.sync_dir(dir);
}

Status write_references(FileSystem& fs, const std::string& tmp_dir, const std::set<std::string>& files, bool fsync) {
  std::string text;
  for (const std::string& f : files) text += f + "\n";
  const std::string path = tmp_dir + "/" + kReferencesFile, staged = path + ".new";
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(staged));
  DISTCKPT_RETURN_IF_ERROR(file->write_at(text.data(), text.size(), 0));
  if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
  DISTCKPT_RETURN_IF_ERROR(file->close());
  DISTCKPT_RETURN_IF_ERROR(fs.rename(staged, path));
  if (fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(tmp_dir));
  return Status();
}

Result<LiveFiles> live_files(FileSystem& fs, const std::string& root) {
  DISTCKPT_ASSIGN_OR_RETURN(auto entries, fs.list_dir(root));
  LiveFiles live;
  for (const auto& e : entries) {
    if (!e.is_dir || e.name.rfind(kMetaDir, 0) == 0 || trashed_name(e.name)) continue;
    const std::string dir = root + "/" + e.name;
    if (is_in_flight_name(e.name)) {
      const std::string path = dir + "/" + kReferencesFile;
      if (!fs.exists(path)) continue;  // references nothing (yet: see the top of references.h)
      auto text = read_whole_file(fs, path, kMaxReferencesBytes);
      if (!text.ok()) {
        if (fs.exists(dir)) live.unknown.push_back(e.name + " (" + text.status().to_string() + ")");
        continue;  // committed or discarded meanwhile: a committed one is read below or next time
      }
      for (std::size_t at = 0; at < text->size();) {
        std::size_t end = text->find('\n', at);
        if (end == std::string::npos) end = text->size();
        if (end > at) live.files.insert(text->substr(at, end - at));
        at = end + 1;
      }
      continue;
    }
    if (!fs.exists(dir + "/" + internal_format::kIndexFileName)) continue;  // retired, or not a checkpoint
    auto index = internal_format::read_stored_index(fs, dir);
    if (!index.ok()) {
      live.unknown.push_back(e.name + " (" + index.status().to_string() + ")");
      continue;
    }
    for (const auto& f : index->files())
      if (!f.checkpoint().empty()) live.files.insert(reference_key(f.checkpoint(), f.name()));
  }
  return live;
}

bool is_retired_entry(FileSystem& fs, const std::string& root, const std::string& name) {
  const std::string dir = root + "/" + name;
  return fs.exists(dir + "/" + kRetiredIndexFile) && !fs.exists(dir + "/" + internal_format::kIndexFileName);
}

namespace {

// Step 3 of a retirement, for one retired checkpoint: its files that nothing references
// go; the directory goes when none is left. Returns whether it is gone.
// `*trash`: a directory renamed away, for the caller to remove once it released the lock.
// `lock`: the references lock `live` was read under, checked before each removal (a
// holder stalled past a waiter's silence may have lost it, and `live` with it).
Result<bool> free_unreferenced(FileSystem& fs, const RootLock& lock, const std::string& root, const std::string& name,
                               const LiveFiles& live, uint64_t* kept_files, uint64_t* kept_bytes,
                               std::vector<std::string>* trash, bool dry_run = false) {
  const std::string dir = root + "/" + name;
  DISTCKPT_ASSIGN_OR_RETURN(auto children, fs.list_dir(dir));
  std::vector<std::string> dead;
  bool keeps = false;
  for (const auto& c : children) {
    if (c.name == kRetiredIndexFile || c.name == kReferencedMarker) continue;
    if (!c.is_dir && live.files.count(reference_key(name, c.name))) {
      keeps = true;
      ++*kept_files;
      if (auto size = fs.file_size(dir + "/" + c.name); size.ok()) *kept_bytes += *size;
    } else {
      dead.push_back(c.name);
    }
  }
  if (!live.unknown.empty()) return false;  // what is referenced is not known: nothing goes
  if (dry_run) return !keeps;  // what would go, nothing touched
  if (keeps) {
    for (const std::string& d : dead) {
      DISTCKPT_RETURN_IF_ERROR(lock.still_held());
      DISTCKPT_RETURN_IF_ERROR(fs.remove_all(dir + "/" + d));
      internal_base::kill_point("retire-free");
    }
    return false;
  }
  // Nothing referenced: the directory goes the way retirement always removed one,
  // renamed away first so that no half-removed entry is ever seen under its name.
  const std::string renamed = make_trash_name(root, name) + owner_suffix();
  DISTCKPT_RETURN_IF_ERROR(lock.still_held());
  DISTCKPT_RETURN_IF_ERROR(fs.rename_no_replace(dir, renamed));
  (void)fs.sync_dir(root);
  trash->push_back(renamed);  // what is renamed away is no one's: removed outside the lock
  return true;
}

}  // namespace

Status retire_checkpoint(FileSystem& fs, const std::string& root, const std::string& name) {
  // An object root has no rename: its index goes first (object_root.h), then its data.
  if (is_object_root(root)) return remove_object_checkpoint(root, name);
  const std::string path = root + "/" + name;
  const std::string index = path + "/" + internal_format::kIndexFileName;
  // Renamed away (atomically, durably); the removal itself runs after the lock is
  // released: a trash name is never a checkpoint, never read, never referenced.
  auto rename_away = [&](std::vector<std::string>* trash) -> Status {
    const std::string renamed = make_trash_name(root, name) + owner_suffix();
    DISTCKPT_RETURN_IF_ERROR(fs.rename_no_replace(path, renamed));
    DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(root));
    trash->push_back(renamed);
    return Status();
  };
  auto remove_trash = [&](const std::vector<std::string>& trash) -> Status {
    internal_base::kill_point("retire-remove");
    for (const std::string& t : trash) DISTCKPT_RETURN_IF_ERROR(fs.remove_all(t));
    return Status();
  };
  std::vector<std::string> trash;
  // A single file (references only point into directories), or no checkpoint at all.
  if (!is_directory_of(fs, root, name) || (!fs.exists(index) && !fs.exists(path + "/" + kRetiredIndexFile))) {
    DISTCKPT_RETURN_IF_ERROR(rename_away(&trash));
    return remove_trash(trash);
  }
  {
    DISTCKPT_ASSIGN_OR_RETURN(auto lock, lock_references(fs, root));
    // Step 1: unlisted, and no longer a base any save can start from.
    if (fs.exists(index)) {
      DISTCKPT_RETURN_IF_ERROR(fs.rename(index, path + "/" + kRetiredIndexFile));
      DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(path));
    }
    internal_base::kill_point("retire-unlisted");
    if (!fs.exists(path + "/" + kReferencedMarker)) {
      // Step 2: never a base, so nothing references its files.
      DISTCKPT_RETURN_IF_ERROR(lock->still_held());
      DISTCKPT_RETURN_IF_ERROR(rename_away(&trash));
    } else {
      // Step 3.
      DISTCKPT_ASSIGN_OR_RETURN(LiveFiles live, live_files(fs, root));
      uint64_t files = 0, bytes = 0;
      DISTCKPT_RETURN_IF_ERROR(free_unreferenced(fs, *lock, root, name, live, &files, &bytes, &trash).status());
    }
  }
  return remove_trash(trash);
}

Result<SweepReport> sweep_retired(FileSystem& fs, const std::string& root, bool dry_run) {
  DISTCKPT_ASSIGN_OR_RETURN(auto entries, fs.list_dir(root));
  SweepReport report;
  std::vector<std::string> retired;
  for (const auto& e : entries)
    if (e.is_dir && !is_in_flight_name(e.name) && e.name.rfind(kMetaDir, 0) != 0 && is_retired_entry(fs, root, e.name))
      retired.push_back(e.name);
  if (retired.empty()) return report;
  auto lock = lock_references(fs, root);
  if (!lock.ok()) return lock.status();
  auto live_or = live_files(fs, root);
  if (!live_or.ok()) return live_or.status();
  const LiveFiles& live = *live_or;
  std::vector<std::string> trash;
  for (const std::string& u : live.unknown)
    report.warnings.push_back("the references of '" + root + "/" + u +
                              "' cannot be read: no file of a retired checkpoint is freed until it is repaired or removed");
  for (const std::string& name : retired) {
    auto gone = free_unreferenced(fs, **lock, root, name, live, &report.kept_files, &report.kept_bytes, &trash, dry_run);
    if (!gone.ok()) {
      report.warnings.push_back("retired checkpoint '" + root + "/" + name + "': " + gone.status().to_string());
      report.kept.push_back(name);
    } else {
      (*gone ? report.removed : report.kept).push_back(name);
    }
  }
  lock->reset();  // what was renamed away is removed without holding up savers
  for (const std::string& t : trash)
    if (Status st = fs.remove_all(t); !st.ok()) report.warnings.push_back("removing '" + t + "': " + st.to_string());
  return report;
}

}  // namespace distckpt::internal_catalog
