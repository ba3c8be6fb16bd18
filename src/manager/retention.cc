#include "manager/retention.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace distckpt::internal_manager {
namespace {

// Commit order (the sequence number; ties by time, then name, for determinism).
void sort_by_commit(std::vector<SeriesEntry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const SeriesEntry& a, const SeriesEntry& b) {
    if (a.commit_seq != b.commit_seq) return a.commit_seq < b.commit_seq;
    if (a.created_unix_ms != b.created_unix_ms) return a.created_unix_ms < b.created_unix_ms;
    return a.name < b.name;
  });
}

// Indices of `entries` (in commit order) with a metric, best first; ties: newer first.
std::vector<std::size_t> ranked_by_metric(const std::vector<SeriesEntry>& entries, CompareRule rule) {
  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (entries[i].metric && !std::isnan(*entries[i].metric)) ranked.push_back(i);
  const bool greater = rule == CompareRule::kGreater;
  std::stable_sort(ranked.begin(), ranked.end(), [&](std::size_t a, std::size_t b) {
    const double x = *entries[a].metric, y = *entries[b].metric;
    if (x != y) return greater ? x > y : x < y;
    return a > b;
  });
  return ranked;
}

}  // namespace

std::vector<std::string> best_by_metric(std::vector<SeriesEntry> entries, CompareRule rule) {
  sort_by_commit(entries);
  std::vector<std::string> names;
  for (std::size_t i : ranked_by_metric(entries, rule)) names.push_back(entries[i].name);
  return names;
}

std::vector<std::string> retention_deletes(std::vector<SeriesEntry> entries, const RetentionPolicy& policy) {
  if (entries.empty()) return {};
  sort_by_commit(entries);
  const std::size_t n = entries.size();
  std::vector<bool> keep(n, false);
  keep[n - 1] = true;  // the newest committed checkpoint
  if (policy.keep_max > 0) {
    // MindSpore's CheckpointConfig: with keep_checkpoint_max set, per-minutes is ignored.
    for (std::size_t i = n > static_cast<std::size_t>(policy.keep_max) ? n - policy.keep_max : 0; i < n; ++i)
      keep[i] = true;
  } else if (policy.keep_per_n_minutes > 0) {
    // MindSpore's rule (ModelCheckpoint._save_ckpt, keep_one_ckpoint_per_minutes): every
    // checkpoint stays unless this save's decision falls inside the window of the
    // previous save's start; then the window's checkpoints go but its oldest.
    const double period_ms = policy.keep_per_n_minutes * 60'000.0;
    keep.assign(n, true);
    if (static_cast<double>(policy.decided_unix_ms - policy.previous_start_unix_ms) < period_ms) {
      std::optional<std::size_t> oldest;
      std::vector<std::size_t> window;
      for (std::size_t i = 0; i < n; ++i) {
        if (entries[i].name == policy.saving) continue;  // written after the decision
        if (static_cast<double>(policy.decided_unix_ms - entries[i].created_unix_ms) >= period_ms) continue;
        window.push_back(i);
        if (!oldest || entries[i].created_unix_ms < entries[*oldest].created_unix_ms) oldest = i;
      }
      for (std::size_t i : window)
        if (i != *oldest) keep[i] = false;
    }
    keep[n - 1] = true;
  } else {
    return {};  // both 0: keep all (MindSpore would keep 1)
  }
  if (policy.keep_best > 0) {
    const std::vector<std::size_t> ranked = ranked_by_metric(entries, policy.rule);
    for (std::size_t k = 0; k < ranked.size() && k < static_cast<std::size_t>(policy.keep_best); ++k) keep[ranked[k]] = true;
  }
  std::vector<std::string> deletes;
  for (std::size_t i = 0; i < n; ++i)
    if (!keep[i]) deletes.push_back(entries[i].name);
  return deletes;
}

}  // namespace distckpt::internal_manager
