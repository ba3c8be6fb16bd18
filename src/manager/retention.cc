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
    // One per N minutes of commit time: the first of each period, the newest besides.
    const auto period_ms = static_cast<int64_t>(policy.keep_per_n_minutes * 60'000.0);
    std::optional<int64_t> last;
    for (std::size_t i = 0; i < n; ++i)
      if (!last || entries[i].created_unix_ms - *last >= period_ms) {
        keep[i] = true;
        last = entries[i].created_unix_ms;
      }
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
