// Collecting what abandoned saves left in a root: temporary entries (".tmp-<id>") whose
// owner is provably gone, in the root and in its catalog directory (.distckpt: a root
// lock a breaker set aside, claims.h). A local owner (this host, this boot, this pid namespace) is
// gone when its process is; a remote one when its heartbeat is older than the lease, by
// the file system's own clock. Entries without an owner record (older builds) are only
// collected by hand, when older than `older_than`. Crash-safe: an entry's owner record
// is removed last, so a collector killed half way leaves an entry the next one collects.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

struct GcOptions {
  bool dry_run = false;
  double lease_s = 600;  // a remote owner whose heartbeat is older is gone (>= kMinLeaseSeconds)
  // By hand: entries without an owner record (and retirement trash) older than this
  // are collected too; a remote owner's lease becomes this when it is longer.
  std::optional<double> older_than_s;
};

struct GcEntry {
  std::string name;
  std::string reason;  // why it was (or would be) removed, or kept
  bool removed = false;
};
struct GcReport {
  std::vector<GcEntry> removed;  // collected (dry_run: would be)
  std::vector<GcEntry> kept;     // owner alive, or not provably gone
  std::vector<std::string> warnings;
};

// An entry gc judges: where it is, how it is shown, its name in its directory (which may
// name its owner: tmp_file_owner), and whether it is a directory (or key prefix).
struct Candidate {
  std::string path, shown, entry_name;
  bool is_dir = false;
};

// The saves of an object root that never committed (or are still writing): every
// <name>/s-<id>/ prefix that <name>/index.pb does not name (object_root.cc). Errors of
// the listing; a name whose index cannot be read now (only a missing one means "not
// committed") is skipped, with a line in `warnings`.
Result<std::vector<Candidate>> object_saves_in_flight(FileSystem& fs, const std::string& root,
                                                      std::vector<std::string>* warnings);

// An object root's incomplete multipart uploads begun more than `lease_s` ago by the store's
// clock (a writer killed mid-object): aborted unless `dry_run`, each reported as an entry.
Result<std::vector<GcEntry>> abort_stale_uploads(const std::string& root, double lease_s, bool dry_run);

// Local, rank 0 of a manager or the `distckpt gc` tool. An object root's saves in flight
// (<name>/s-<id>/ that no index names: object_root.h) are judged as the file system's
// .tmp-* entries are, their heartbeat's age by the store's clock. Never removes an entry whose
// owner is alive, a checkpoint, or anything that is not a temporary entry. kNotFound for
// a missing root; failures to remove an entry are warnings.
Result<GcReport> collect_garbage(FileSystem& fs, const std::string& root, const GcOptions& options);

// Parses "30m", "2h", "7d", "90s" (or plain seconds); kInvalidArgument otherwise.
Result<double> parse_duration_s(const std::string& text);

}  // namespace distckpt::internal_catalog
