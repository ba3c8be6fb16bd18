// Listing and resolving checkpoints under a root directory (local, read-only).
#include "catalog/listing.h"
#include "catalog/object_root.h"
#include "storage/object_fs.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "base/strings.h"
#include "catalog/names.h"
#include "catalog/references.h"
#include "catalog/retire.h"
#include "format/describe.h"
#include "format/ckpt/strategy.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/stored.h"
#include "format/ckpt/framed_file.h"

namespace distckpt {

using internal_catalog::is_checkpoint_file_name;
using internal_catalog::kLatestFileName;
using internal_catalog::read_latest_pointer;
using internal_format::kIndexFileName;

namespace {
std::shared_ptr<FileSystem> or_posix(const std::string& path, std::shared_ptr<FileSystem> fs) {
  return internal_storage::filesystem_for(path, std::move(fs));
}
}  // namespace

namespace internal_catalog {

std::string read_latest_pointer(FileSystem& fs, const std::string& root) {
  const std::string path = root + "/" + kLatestFileName;
  auto size = fs.file_size(path);
  if (!size.ok() || *size > kMaxLatestBytes) return "";  // a pointer is a short name
  auto text = read_whole_file(fs, path, kMaxLatestBytes);
  if (!text.ok()) return "";
  return parse_latest_pointer(*text);
}

std::string parse_latest_pointer(std::string text) {
  if (text.size() > kMaxLatestBytes) return "";
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (!validate_checkpoint_name(text).ok()) return "";
  return text;
}

bool newer(const CheckpointEntry& a, const CheckpointEntry& b, const std::string& latest) {
  return std::make_tuple(a.commit_seq, a.name == latest, a.created_unix_ms, a.step) >
         std::make_tuple(b.commit_seq, b.name == latest, b.created_unix_ms, b.step);
}

uint64_t next_commit_seq(FileSystem& fs, const std::string& root) {
  const std::string latest = read_latest_pointer(fs, root);
  if (!latest.empty()) {
    auto index = internal_format::read_stored_summary(fs, root + "/" + latest);
    if (index.ok()) return index->commit_seq() + 1;
  }
  uint64_t highest = 0;
  InspectOptions options;
  options.fs = std::shared_ptr<FileSystem>(&fs, [](FileSystem*) {});
  auto listing = list_checkpoints(root, options);
  if (listing.ok())
    for (const auto& e : listing->entries) highest = std::max(highest, e.commit_seq);
  return highest + 1;
}
}  // namespace internal_catalog

Result<RootListing> list_checkpoints(const std::string& root, const InspectOptions& options) {
  // With a key, .ckpt files encrypted whole are listed with their step and order.
  const std::shared_ptr<FileSystem> fs = internal_format::with_key(or_posix(root, options.fs), options.key.get());
  DISTCKPT_ASSIGN_OR_RETURN(auto entries, fs->list_dir(root));
  RootListing listing;
  std::vector<CheckpointEntry> committed, other;
  std::map<std::pair<std::string, uint64_t>, Status> identities;  // referenced checkpoints, checked
  for (const auto& e : entries) {
    // Directories are native checkpoints; files only in a single-file format.
    if (!e.is_dir && !is_checkpoint_file_name(e.name)) continue;
    if (e.name.rfind(internal_catalog::kMetaDir, 0) == 0) continue;  // the catalog's own
    CheckpointEntry entry;
    entry.name = e.name;
    if (internal_catalog::is_in_flight_name(e.name)) {
      entry.state = EntryState::kInFlight;
      entry.detail = "save in progress or abandoned (not a checkpoint)";
      other.push_back(std::move(entry));
      continue;
    }
    if (e.is_dir && internal_catalog::is_object_root(root)) {
      // An object root's name without its index: saves that never committed (object_root.h).
      // An index that cannot be read now is no sign of that: read below, it is listed broken.
      auto index_size = fs->file_size(root + "/" + e.name + "/" + kIndexFileName);
      if (!index_size.ok() && index_size.status().code() == StatusCode::kNotFound) {
        entry.state = EntryState::kInFlight;
        entry.detail = "save in progress or abandoned (no index: not committed)";
        other.push_back(std::move(entry));
        continue;
      }
    }
    if (e.is_dir && internal_catalog::is_retired_entry(*fs, root, e.name)) {
      entry.state = EntryState::kRetired;
      uint64_t files = 0;
      if (auto children = fs->list_dir(root + "/" + e.name); children.ok())
        for (const auto& c : *children) {
          if (c.name == internal_catalog::kRetiredIndexFile || c.name == internal_catalog::kReferencedMarker) continue;
          ++files;
          if (auto size = fs->file_size(root + "/" + e.name + "/" + c.name); size.ok()) entry.bytes += *size;
        }
      entry.detail =
          fs->exists(root + "/" + e.name + "/" + internal_catalog::kReferencedMarker)
              ? std::to_string(files) +
                    " data file(s) left, each kept while a later checkpoint references it (retention and gc free "
                    "the others)"
              : "retirement unfinished (" + std::to_string(files) +
                    " data file(s) no checkpoint references; the next retention or gc removes them)";
      other.push_back(std::move(entry));
      continue;
    }
    if (!e.is_dir) {
      // A file with a checkpoint format's extension but another format's contents is
      // someone else's file: never ours to resume from, retain or remove.
      const internal_format::FormatDriver* format = internal_format::driver_for_file_name(e.name);
      auto file = fs->open_readable(root + "/" + e.name);
      auto size = file.ok() ? (*file)->size() : Result<uint64_t>(file.status());
      if (format != nullptr && size.ok()) {
        if (auto why = internal_format::foreign_reason(*format, **file, *size)) {
          entry.state = EntryState::kForeign;
          entry.detail = "not a " + std::string(format->name) + " checkpoint: " + *why;
          other.push_back(std::move(entry));
          continue;
        }
      }
    }
    auto index = internal_format::read_stored_summary(*fs, root + "/" + e.name);
    if (!index.ok()) {
      entry.state = EntryState::kBroken;
      entry.detail = index.status().to_string();
      other.push_back(std::move(entry));
      continue;
    }
    // An incremental checkpoint whose referenced files are gone (removed by hand,
    // bypassing retirement) cannot load: listed as damaged, never resumed from.
    // So is one whose referenced checkpoint lost its index or was replaced (what
    // verify and load check: check_reference_identity), read once per listing.
    std::string dangling;
    for (const auto& f : index->files()) {
      if (f.checkpoint().empty()) continue;
      const std::string path = root + "/" + f.checkpoint() + "/" + f.name();
      auto size = fs->file_size(path);
      if (!size.ok() || *size != f.size()) {
        dangling = "it references '" + path + "', which is " + (size.ok() ? "of another size" : "missing");
        break;
      }
      auto known = identities.find({f.checkpoint(), f.checkpoint_seq()});
      if (known == identities.end())
        known = identities.emplace(std::make_pair(f.checkpoint(), f.checkpoint_seq()),
                                   internal_format::check_reference_identity(*fs, root, f)).first;
      if (!known->second.ok()) {
        dangling = known->second.message();
        break;
      }
    }
    if (!dangling.empty()) {
      entry.state = EntryState::kBroken;
      entry.detail = dangling;
      other.push_back(std::move(entry));
      continue;
    }
    entry.state = EntryState::kCommitted;
    // Data nothing checks (a .ckpt MindSpore wrote without its footer, HDF5): a warning.
    entry.sealed = index->has_file_encryption() && !index->file_encryption().opened();
    if (entry.sealed)
      entry.detail = "encrypted whole (" + index->file_encryption().mode() + "): step and tensors need its key";
    else if (!internal_format::has_data_checks(*index))
      entry.detail = "unchecked: " + internal_format::data_checks_text(*index);
    // A per-rank set whose layouts no MindSpore strategy expresses has no strategy file.
    if (internal_format::is_per_rank_set(*index) && entry.detail.empty()) {
      const auto& files = index->files();
      if (std::none_of(files.begin(), files.end(),
                       [](const proto::File& f) { return f.name() == internal_format::kStrategyFileName; })) {
        Result<std::string> strategy = internal_format::mindspore_strategy(*index);
        entry.detail = strategy.ok() ? "no MindSpore strategy file" : strategy.status().message();
      }
    }
    entry.step = index->step();
    entry.epoch = index->epoch();
    entry.format = internal_format::stored_format(*index);
    entry.per_rank_files = internal_format::is_per_rank_set(*index);
    entry.created_unix_ms = index->created_unix_ms();
    entry.commit_seq = index->commit_seq();
    entry.advances_latest = index->advances_latest();
    for (const auto& f : index->files()) {
      if (f.checkpoint().empty()) {
        entry.bytes += f.size();
        continue;
      }
      entry.referenced_bytes += f.size();
      if (std::find(entry.references.begin(), entry.references.end(), f.checkpoint()) == entry.references.end())
        entry.references.push_back(f.checkpoint());
    }
    committed.push_back(std::move(entry));
  }
  std::sort(committed.begin(), committed.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return std::tie(a.step, a.created_unix_ms, a.name) < std::tie(b.step, b.created_unix_ms, b.name);
  });
  std::sort(other.begin(), other.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.name < b.name; });
  const std::string latest = read_latest_pointer(*fs, root);
  for (const auto& c : committed)
    if (c.name == latest) listing.latest = latest;
  listing.entries = std::move(committed);
  listing.entries.insert(listing.entries.end(), other.begin(), other.end());
  return listing;
}

Status remove_checkpoint(const std::string& root, const std::string& name, const InspectOptions& options) {
  const std::shared_ptr<FileSystem> fs = or_posix(root, options.fs);
  DISTCKPT_RETURN_IF_ERROR(internal_catalog::validate_checkpoint_name(name).with_context("remove"));
  if (internal_catalog::is_object_root(root))
    return internal_catalog::remove_object_checkpoint(root, name).with_context("remove '" + root + "/" + name + "'");
  // Only a committed checkpoint: an entry in flight is gc's, a retired one the sweep's.
  auto index = internal_format::read_stored_summary(*fs, root + "/" + name);
  if (!index.ok())
    return index.status().code() == StatusCode::kNotFound
               ? not_found("remove: no committed checkpoint '" + name + "' in '" + root + "'")
               : index.status().with_context("remove '" + root + "/" + name + "'");
  return internal_catalog::retire_checkpoint(*fs, root, name).with_context("remove '" + root + "/" + name + "'");
}

Result<std::string> resolve_checkpoint(const std::string& path, const InspectOptions& options) {
  const std::shared_ptr<FileSystem> fs = or_posix(path, options.fs);
  if (fs->exists(path + "/" + kIndexFileName)) return path;
  if (is_checkpoint_file_name(internal_base::base_name(path))) {
    // A file (opened with the key where one was given): its reader says what is wrong
    // with it, a wrong key included, better than listing it as a directory would.
    auto file = fs->open_readable(path);
    if (file.ok() || file.status().code() == StatusCode::kAuthFailed || file.status().code() == StatusCode::kCorruption ||
        file.status().code() == StatusCode::kUnsupported)
      return path;
  }
  if (!fs->exists(path)) return not_found("resolve: '" + path + "' does not exist");
  DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(path, options));
  // A damaged newest checkpoint is never skipped silently: when `latest` names a broken
  // checkpoint, resuming from an older one is the caller's decision (load it by path).
  const std::string pointer = read_latest_pointer(*fs, path);
  std::string broken;
  for (const auto& e : listing.entries) {
    if (e.state != EntryState::kBroken) continue;
    // A wrong key is no damage to fall back from: an older checkpoint would fail alike.
    if (e.name == pointer && e.detail.rfind(Status(StatusCode::kAuthFailed, "").to_string(), 0) == 0)
      return auth_failed("resolve: '" + path + "/latest' names '" + e.name + "', which this key cannot open (" +
                         e.detail + ")");
    if (e.name == pointer)
      return corruption("resolve: '" + path + "/latest' names '" + e.name + "', which is damaged (" + e.detail +
                        "); load an older checkpoint by its path to fall back");
    broken += (broken.empty() ? "" : ", ") + e.name;
  }
  // Without its key, an encrypted .ckpt cannot be ordered: `latest` naming it decides.
  for (const auto& e : listing.entries)
    if (e.name == pointer && e.state == EntryState::kCommitted && e.sealed) return path + "/" + e.name;
  bool any_advancing = false;
  for (const auto& e : listing.entries) any_advancing |= e.state == EntryState::kCommitted && e.advances_latest;
  const CheckpointEntry* newest = nullptr;
  for (const auto& e : listing.entries) {
    if (e.state != EntryState::kCommitted || (any_advancing && !e.advances_latest)) continue;
    if (newest == nullptr || internal_catalog::newer(e, *newest, listing.latest)) newest = &e;
  }
  if (newest == nullptr) {
    if (fs->exists(path + "/" + internal_format::kRetiredIndexFileName))
      return not_found("resolve: '" + path + "' is a retired checkpoint (its files stay for later checkpoints "
                       "that reference them): not loadable");
    // A native checkpoint's directory that lost its index is no empty root.
    if (auto inside = fs->list_dir(path); inside.ok() && listing.entries.empty())
      for (const auto& e : *inside)
        if (!e.is_dir && internal_base::starts_with(e.name, "data-") && internal_base::ends_with(e.name, ".bin"))
          return corruption("resolve: '" + path + "' holds data files but no " + kIndexFileName +
                            ": a checkpoint that lost its index, or a save that never committed");
    return not_found("resolve: no committed checkpoint under '" + path + "'" +
                     (broken.empty() ? "" : " (damaged: " + broken + ")"));
  }
  return internal_base::trim_trailing_slashes(path) + "/" + newest->name;
}

}  // namespace distckpt
