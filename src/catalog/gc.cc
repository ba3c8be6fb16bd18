#include "catalog/gc.h"

#include <algorithm>
#include <cstdio>

#include "base/kill_point.h"
#include "catalog/names.h"
#include "catalog/object_root.h"
#include "catalog/owner.h"
#include "catalog/references.h"

namespace distckpt::internal_catalog {

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f s", s);
  return buf;
}

// Removes an entry with its owner record last (see the top of gc.h).
Status remove_entry(FileSystem& fs, const std::string& path, bool is_dir) {
  if (!is_dir) return fs.remove_file(path);
  DISTCKPT_ASSIGN_OR_RETURN(auto children, fs.list_dir(path));
  for (const auto& c : children) {
    if (c.name == kOwnerFile) continue;
    DISTCKPT_RETURN_IF_ERROR(fs.remove_all(path + "/" + c.name));
    internal_base::kill_point("gc-removing");  // killed here, the next collector finishes
  }
  return fs.remove_all(path);
}

}  // namespace

Result<double> parse_duration_s(const std::string& text) {
  if (text.empty()) return invalid_argument("duration: empty");
  double unit = 1;
  std::string number = text;
  switch (text.back()) {
    case 's': unit = 1; number.pop_back(); break;
    case 'm': unit = 60; number.pop_back(); break;
    case 'h': unit = 3600; number.pop_back(); break;
    case 'd': unit = 86400; number.pop_back(); break;
    default: break;
  }
  try {
    std::size_t used = 0;
    const double v = std::stod(number, &used);
    if (used != number.size() || !(v >= 0)) throw std::invalid_argument(text);
    return v * unit;
  } catch (const std::exception&) {
    return invalid_argument("duration '" + text + "': expected a number with s, m, h or d (30m, 2h, 7d)");
  }
}

Result<GcReport> collect_garbage(FileSystem& fs, const std::string& root, const GcOptions& options) {
  GcReport report;
  std::optional<int64_t> now_ns;  // the file system's clock, asked once and only if needed
  auto age_s = [&](const std::string& path) -> std::optional<double> {
    if (!now_ns) {
      auto now = file_system_now_ns(fs, root);
      if (!now.ok()) {
        report.warnings.push_back("gc: the file system's clock: " + now.status().to_string());
        now_ns = -1;
      } else {
        now_ns = *now;
      }
    }
    if (*now_ns < 0) return std::nullopt;
    auto modified = fs.modified_time_ns(path);
    if (!modified.ok()) return std::nullopt;
    return static_cast<double>(*now_ns - *modified) / 1e9;
  };
  const double lease = std::max({options.lease_s, kMinLeaseSeconds, options.older_than_s.value_or(0)});
  // The temporary entries of one directory: the root's (abandoned saves, retirement's
  // trash) and the catalog's own (a lock a breaker set aside, a counter never renamed).
  // Each candidate is judged by its owner and removed (owner record last) once it is gone.
  auto collect = [&](const std::vector<Candidate>& candidates) {
    for (const Candidate& e : candidates) {
      const std::string& path = e.path;
      GcEntry entry{e.shown, "", false};
      bool gone = false;
      auto owner = e.is_dir ? read_owner(fs, path) : Result<OwnerRecord>(not_found("a file"));
      // An entry without an owner record may name its owner (a temporary file, a trash
      // directory).
      const std::optional<TmpFileOwner> file_owner =
          owner.ok() ? std::nullopt : tmp_file_owner(e.entry_name);
      if (file_owner) {
        // A temporary file lives for one write and rename under a lock, a trash directory
        // for one removal: a remote one older than the lease is abandoned too.
        OwnerRecord local = OwnerRecord::self();
        if (file_owner->host_tag == local.host_tag()) {
          local.pid = file_owner->pid;
          local.start_time = file_owner->start_time;
          gone = local.local_process_gone();
          entry.reason = "owner pid " + std::to_string(file_owner->pid) + " on this host " +
                         (gone ? "is gone" : "is running");
        } else {
          const auto age = age_s(path);
          gone = age && *age > lease;
          entry.reason = "owner pid " + std::to_string(file_owner->pid) + " on another host: " +
                         (age ? seconds_text(*age) + " old" : std::string("age unknown")) +
                         (gone ? ", past the lease of " : ", within the lease of ") + seconds_text(lease);
        }
      } else if (owner.ok()) {
        if (owner->is_local()) {
          gone = owner->local_process_gone();
          entry.reason = "owner pid " + std::to_string(owner->pid) + " on this host " +
                         (gone ? "is gone" : "is running");
        } else {
          // The heartbeat, else the record itself, says when the owner was last seen.
          auto age = age_s(path + "/" + kHeartbeatFile);
          if (!age) age = age_s(path + "/" + kOwnerFile);
          gone = age && *age > lease;
          entry.reason = "owner pid " + std::to_string(owner->pid) + " on host '" + owner->hostname + "': " +
                         (age ? "last heartbeat " + seconds_text(*age) + " ago" : "no heartbeat readable") +
                         (gone ? ", past the lease of " : ", within the lease of ") + seconds_text(lease);
        }
      } else if (owner.status().code() == StatusCode::kNotFound) {
        // No owner record: an older build's entry, a retirement's trash, a pointer update.
        const auto age = age_s(path);
        gone = options.older_than_s && age && *age > *options.older_than_s;
        entry.reason = "no owner record" + (age ? ", " + seconds_text(*age) + " old" : std::string()) +
                       (options.older_than_s ? "" : ": collected only by hand (--older-than)");
      } else {
        entry.reason = "owner record unreadable (" + owner.status().to_string() + ")";
      }
      if (!gone) {
        report.kept.push_back(std::move(entry));
        continue;
      }
      if (!options.dry_run) {
        Status st = remove_entry(fs, path, e.is_dir);
        if (!st.ok()) {
          report.warnings.push_back("gc: " + st.to_string());
          report.kept.push_back(std::move(entry));
          continue;
        }
      }
      entry.removed = !options.dry_run;
      report.removed.push_back(std::move(entry));
    }
  };
  auto collect_in = [&](const std::string& dir, const std::string& shown_prefix) -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(auto listed, fs.list_dir(dir));
    std::vector<Candidate> candidates;
    for (const auto& e : listed)
      if (is_in_flight_name(e.name)) candidates.push_back({dir + "/" + e.name, shown_prefix + e.name, e.name, e.is_dir});
    collect(candidates);
    return Status();
  };
  DISTCKPT_RETURN_IF_ERROR(collect_in(root, ""));
  // An object root's saves in flight are <name>/s-<id>/ prefixes that no index names.
  if (is_object_root(root)) {
    auto saves = object_saves_in_flight(fs, root, &report.warnings);
    if (saves.ok()) collect(*saves);
    else report.warnings.push_back("gc: " + saves.status().to_string());
    auto uploads = abort_stale_uploads(root, lease, options.dry_run);
    if (uploads.ok()) report.removed.insert(report.removed.end(), uploads->begin(), uploads->end());
    else report.warnings.push_back("gc: " + uploads.status().to_string());
  }
  // A lock set aside by a breaker that found a new holder in it and could not put it back
  // (claims.cc), or one whose breaker died half way, holds its owner's record: collected by
  // the same rules once that owner is gone. A missing catalog directory is no error.
  const std::string meta = root + "/" + kMetaDir;
  if (Status st = collect_in(meta, std::string(kMetaDir) + "/"); !st.ok() && st.code() != StatusCode::kNotFound)
    report.warnings.push_back("gc: " + st.to_string());
  // Retired checkpoints that keep files for incremental saves (references.h): what no
  // checkpoint references any more goes (a dry run says which would).
  auto swept = sweep_retired(fs, root, options.dry_run);
  if (!swept.ok()) {
    report.warnings.push_back("gc: retired checkpoints: " + swept.status().to_string());
  } else {
    for (const std::string& name : swept->removed)
      report.removed.push_back(GcEntry{name, "retired, and nothing references its files any more", !options.dry_run});
    for (const std::string& name : swept->kept)
      report.kept.push_back(GcEntry{name, "retired; keeps the data files later checkpoints reference", false});
    for (const std::string& w : swept->warnings) report.warnings.push_back("gc: " + w);
  }
  return report;
}

}  // namespace distckpt::internal_catalog
