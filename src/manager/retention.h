// Retention: which committed checkpoints of a series a manager deletes. Pure logic,
// unit-tested without MPI or files; the manager runs it on rank 0 after a commit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/config.h"

namespace distckpt::internal_manager {

struct SeriesEntry {
  std::string name;
  uint64_t commit_seq = 0;
  int64_t created_unix_ms = 0;
  std::optional<double> metric;  // the best_metric value saved with it, if any
};

struct RetentionPolicy {
  int keep_max = 0;               // 0: keep all
  double keep_per_n_minutes = 0;  // 0: off
  int keep_best = 0;              // 0: off
  CompareRule rule = CompareRule::kLess;  // kGreater or kLess when keep_best > 0
  // keep_per_n_minutes replays MindSpore's ModelCheckpoint, which decides at each save:
  //  decided_unix_ms: when the save being retained for was decided (before its write);
  //  previous_start_unix_ms: when the previous save of this manager started (its
  //    process's memory: after a restart, when the manager was made);
  //  saving: the listed name of the save being retained for (committed since).
  int64_t decided_unix_ms = 0;
  int64_t previous_start_unix_ms = 0;
  std::string saving;
};

// Names to delete from `entries` (committed checkpoints of one series, any order), by
// MindSpore's CheckpointConfig rules. A checkpoint is kept when any rule keeps it:
//  - keep_max > 0: it is among the keep_max newest (commit order); keep_per_n_minutes
//    is then ignored;
//  - keep_max = 0, keep_per_n_minutes = N > 0: MindSpore's keep_one_ckpoint_per_minutes,
//    replayed. When the save was decided less than N minutes after the previous save
//    started (strictly), of the other checkpoints committed less than N minutes before
//    the decision (strictly) all but the oldest are deleted; otherwise nothing is.
//    So the oldest checkpoint of each trailing window stays;
//  - both 0: every checkpoint is kept;
//  - it is among the keep_best best by metric (NaN and missing values never count;
//    ties go to the newer checkpoint);
//  - it is the newest committed one (never deleted).
std::vector<std::string> retention_deletes(std::vector<SeriesEntry> entries, const RetentionPolicy& policy);

// Names of the entries with a metric (not NaN), best first by `rule` (kGreater or
// kLess); a tie goes to the newer checkpoint, as in retention.
std::vector<std::string> best_by_metric(std::vector<SeriesEntry> entries, CompareRule rule);

}  // namespace distckpt::internal_manager
