#include "manager/stats.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "base/test_seams.h"
#include "catalog/names.h"
#include "catalog/object_root.h"
#include "manager/manager_impl.h"

namespace distckpt::internal_manager {

namespace {
std::string stats_path(const std::string& directory) { return directory + "/" + internal_catalog::kStatsFileName; }
// An object root's statistics: one object per record (catalog/object_root.h).
std::string object_stats_dir(const std::string& directory) {
  return directory + "/" + internal_catalog::kMetaDir + "/stats";
}
}  // namespace

int64_t unix_ms_now() {
  return internal_base::wall_clock_ms();
}

nlohmann::ordered_json metrics_json(const std::map<std::string, double>& metrics) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, value] : metrics)
    out[name] = std::isfinite(value) ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
  return out;
}

std::string metrics_line(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics) {
  nlohmann::ordered_json j;
  j["event"] = "metrics";
  j["step"] = step;
  j["epoch"] = epoch;
  j["metrics"] = metrics_json(metrics);
  j["unix_ms"] = unix_ms_now();
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

void add_resume_lists(nlohmann::ordered_json& line, const ResumeResult& resumed) {
  line["skipped"] = resumed.skipped;
  line["missing_in_checkpoint"] = resumed.missing_in_checkpoint;
  line["unexpected_in_checkpoint"] = resumed.unexpected_in_checkpoint;
  line["filtered_out"] = resumed.filtered_out;
}

Status append_stats_line(FileSystem& fs, const std::string& directory, const nlohmann::ordered_json& record) {
  return append_stats_text(fs, directory, record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

Status append_stats_text(FileSystem& fs, const std::string& directory, std::string text) {
  if (internal_catalog::is_object_root(directory)) {
    // Objects cannot be appended to: one object per record, named in time order (the
    // store's listing is in key order), with a random tail that no other writer makes.
    char ms[24];
    std::snprintf(ms, sizeof(ms), "%020lld", static_cast<long long>(unix_ms_now()));
    return write_file_synced(fs, object_stats_dir(directory) + "/" + ms + "-" + internal_catalog::make_save_dir() +
                                     ".json", text);
  }
  const std::string path = stats_path(directory);
  // A crash mid-append leaves a last line without its newline: end it, so that this
  // line is not glued to it (readers skip the torn one).
  if (auto size = fs.file_size(path); size.ok() && *size > 0) {
    if (auto file = fs.open_readable(path); file.ok()) {
      char last = '\n';
      if ((*file)->read_at(&last, 1, *size - 1).ok() && last != '\n') text.insert(0, "\n");
    }
  }
  return fs.append_synced(path, text);
}

Result<std::vector<std::string>> read_stats_lines(FileSystem& fs, const std::string& directory) {
  std::string text;
  if (internal_catalog::is_object_root(directory)) {
    DISTCKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> records, fs.list_dir(object_stats_dir(directory)));
    for (const DirEntry& r : records) {  // in key order: time order
      DISTCKPT_ASSIGN_OR_RETURN(std::string record, read_whole_file(fs, object_stats_dir(directory) + "/" + r.name,
                                                                    uint64_t{1} << 20));
      text += record + "\n";
    }
  } else {
    DISTCKPT_ASSIGN_OR_RETURN(text, read_whole_file(fs, stats_path(directory), uint64_t{1} << 30));
  }
  std::vector<std::string> lines;
  for (auto& line : internal_base::split(text, '\n')) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) lines.push_back(std::move(line));
  }
  return lines;
}

WriterStats writer_stats(const Comm& comm, const std::vector<std::string>& per_rank) {
  WriterStats out;
  struct Host {
    int ranks = 0;
    uint64_t bytes = 0;
    int64_t slowest_us = 0;
  };
  std::vector<Host> hosts(static_cast<std::size_t>(std::max(comm.node_count(), 1)));
  int64_t lo = INT64_MAX, hi = 0;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    long long us = 0;
    unsigned long long bytes = 0;
    if (std::sscanf(per_rank[r].c_str(), "%lld %llu", &us, &bytes) != 2) us = 0, bytes = 0;
    lo = std::min<int64_t>(lo, us);
    hi = std::max<int64_t>(hi, us);
    const int node = comm.node_of(static_cast<int>(r));
    if (node < 0 || static_cast<std::size_t>(node) >= hosts.size()) continue;
    Host& h = hosts[static_cast<std::size_t>(node)];
    h.ranks += 1;
    h.bytes += bytes;
    h.slowest_us = std::max<int64_t>(h.slowest_us, us);
  }
  out.fastest_s = per_rank.empty() ? 0 : static_cast<double>(lo) / 1e6;
  out.slowest_s = static_cast<double>(hi) / 1e6;
  std::vector<int> first_rank(hosts.size(), -1);  // a rank of each node, to name it
  for (int r = static_cast<int>(per_rank.size()) - 1; r >= 0; --r) {
    const int node = comm.node_of(r);
    if (node >= 0 && static_cast<std::size_t>(node) < hosts.size()) first_rank[static_cast<std::size_t>(node)] = r;
  }
  for (std::size_t n = 0; n < hosts.size(); ++n) {
    if (hosts[n].ranks == 0) continue;
    nlohmann::ordered_json h;
    h["host"] = comm.node_name(first_rank[n]);
    h["ranks"] = hosts[n].ranks;
    h["bytes"] = hosts[n].bytes;
    h["write_s"] = static_cast<double>(hosts[n].slowest_us) / 1e6;
    out.hosts.push_back(std::move(h));
  }
  return out;
}

}  // namespace distckpt::internal_manager

namespace distckpt {

void CheckpointManager::Impl::log_metrics(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics) {
  if (!root() || metrics.empty()) return;
  pending_metrics += internal_manager::metrics_line(step, epoch, metrics);
  // Written with the next save's line (one synced append instead of one a step), or once
  // this much is waiting.
  constexpr std::size_t kFlushBytes = 64 << 10;
  if (pending_metrics.size() >= kFlushBytes) flush_metrics();
}

void CheckpointManager::Impl::flush_metrics() {
  if (!root() || pending_metrics.empty()) return;
  if (Status st = internal_manager::append_stats_text(*fs, cfg.directory, std::move(pending_metrics)); !st.ok())
    std::fprintf(stderr, "distckpt: %s: stats: %s\n", where().c_str(), st.to_string().c_str());
  pending_metrics.clear();
}

}  // namespace distckpt
