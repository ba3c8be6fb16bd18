// The manager's retention on rank 0 after a commit: the policies of manager/retention.h
// applied to the series' committed checkpoints, then the sweeps of what retired ones left.
#include "base/guard.h"
#include "catalog/gc.h"
#include "catalog/listing.h"
#include "catalog/references.h"
#include "catalog/retire.h"
#include "manager/manager_impl.h"
#include "manager/retention.h"
#include "manager/upload.h"

namespace distckpt {

std::vector<std::string> CheckpointManager::Impl::retain(const Record& record, const std::string& committed,
                                                         std::vector<std::string>* warnings) {
  // MindSpore's window (keep_per_n_minutes): the previous save's start, and when each of
  // this manager's saves was committed (a single file's index holds the start of its write,
  // MindSpore goes by the file's mtime: the end of it).
  const int64_t previous_start = previous_save_start_unix_ms;
  previous_save_start_unix_ms = record.decided_unix_ms;
  committed_unix_ms[committed] = unix_ms_now();
  std::vector<std::string> removed;
  // A rewind's abandoned branch goes once the new branch has a committed checkpoint: a
  // crash before that resumes where the job was before the rewind.
  for (const std::string& name : abandoned) {
    if (name == committed || (uploader && uploader->pending(cfg.directory + "/" + name))) continue;
    Status st = internal_catalog::retire_checkpoint(*fs, cfg.directory, name);
    if (st.ok()) removed.push_back(name);
    else warnings->push_back("retention: abandoned branch: " + st.to_string());
  }
  abandoned.clear();
  auto listing = list_checkpoints(cfg.directory, {.fs = fs});
  if (!listing.ok()) {
    warnings->push_back("retention: " + listing.status().to_string());
    return removed;
  }
  std::vector<internal_manager::SeriesEntry> entries = series_with_metrics(*listing);
  for (auto& e : entries)
    if (auto known = committed_unix_ms.find(e.name); known != committed_unix_ms.end()) e.created_unix_ms = known->second;
  internal_manager::RetentionPolicy policy{keep_newest(),
                                           cfg.keep_per_n_minutes,
                                           cfg.best_metric.empty() ? 0 : cfg.keep_best,
                                           rule,
                                           record.decided_unix_ms,
                                           previous_start,
                                           committed};
  for (const auto& name : internal_manager::retention_deletes(std::move(entries), policy)) {
    if (uploader && uploader->pending(cfg.directory + "/" + name)) continue;  // removed once uploaded
    Status st = internal_catalog::retire_checkpoint(*fs, cfg.directory, name);
    if (st.ok()) removed.push_back(name);
    else warnings->push_back("retention: " + st.to_string());
  }
  // Files of retired checkpoints that nothing references any more (incremental saves;
  // a crash in an earlier retirement leaves some too).
  if (auto swept = internal_catalog::sweep_retired(*fs, cfg.directory); swept.ok()) {
    for (const std::string& w : swept->warnings) warnings->push_back("retention: " + w);
    retired_kept_bytes = swept->kept_bytes;
  } else
    warnings->push_back("retention: " + swept.status().to_string());
  // What a crash in an earlier removal of this series left behind.
  internal_catalog::sweep_trash(*fs, cfg.directory,
                                [&](const std::string& name) { return names.matches(series, name); });
  return removed;
}

}  // namespace distckpt
