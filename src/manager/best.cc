// Best checkpoints as MMEngine's save_best keeps them (CheckpointConfig::save_best):
// "best_<metric>_<name>", one per metric, replaced when a better value arrives, read
// back from the directory after a restart. A best copy of a save committed by the same
// call is a second name for its files (hard links), committed with the same protocol.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/guard.h"
#include "base/strings.h"
#include "catalog/commit.h"
#include "catalog/owner.h"
#include "catalog/retire.h"
#include "comm/agree.h"
#include "manager/best.h"
#include "manager/manager_impl.h"
#include "manager/stats.h"

namespace distckpt {

using internal_base::split;
using internal_comm::agree;

namespace internal_manager {

std::string best_file_metric(const std::string& metric) {
  std::string m = metric;
  for (char& c : m)
    if (c == '/') c = '_';  // as MMEngine names its files
  return m;
}

std::optional<double> numeric_info(const std::map<std::string, InfoValue>& info, const std::string& key) {
  auto it = info.find(key);
  if (it == info.end()) return std::nullopt;
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return std::nullopt;
}

std::string best_metric_of(const std::string& entry_name, const std::map<std::string, InfoValue>& info) {
  if (entry_name.rfind("best_", 0) != 0) return "";
  for (const auto& [key, value] : info) {
    const std::string head = "best_" + best_file_metric(key) + "_";
    if (entry_name.size() > head.size() && entry_name.compare(0, head.size(), head) == 0 && numeric_info(info, key))
      return key;
  }
  return "";
}

namespace {

// Rank 0: commits <dir>/<name> as hard links to the files of the committed checkpoint
// `source` (a directory, recursively, or a single file), with the commit protocol's
// temporary entry, fsyncs and no-replace rename; `latest` does not move. kUnsupported
// when the file system cannot link (the caller writes a copy instead).
Status link_checkpoint(FileSystem& fs, const std::string& dir, const std::string& source, const std::string& name,
                       bool fsync, const std::string& who) {
  const bool is_dir = fs.list_dir(source).ok();
  DISTCKPT_ASSIGN_OR_RETURN(internal_catalog::Entry entry, internal_catalog::begin_entry(fs, dir, name, is_dir, who));
  Status st = [&]() -> Status {
    if (!is_dir) {
      (void)fs.remove_file(entry.target());  // begin_entry made it for writers
      return fs.link_file(source, entry.target());
    }
    std::function<Status(const std::string&, const std::string&)> link_tree = [&](const std::string& from,
                                                                                  const std::string& to) -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> children, fs.list_dir(from));
      for (const auto& c : children) {
        if (c.is_dir) {
          DISTCKPT_RETURN_IF_ERROR(fs.create_dir(to + "/" + c.name));
          DISTCKPT_RETURN_IF_ERROR(link_tree(from + "/" + c.name, to + "/" + c.name));
        } else {
          DISTCKPT_RETURN_IF_ERROR(fs.link_file(from + "/" + c.name, to + "/" + c.name));
        }
      }
      return fsync ? fs.sync_dir(to) : Status();
    };
    return link_tree(source, entry.tmp);
  }();
  if (st.ok()) {
    auto installed = internal_catalog::install_checkpoint(fs, dir, is_dir ? entry.tmp : entry.target(), name, fsync,
                                                          {false, entry.commit_seq});
    st = installed.status();
    if (st.ok() && is_dir) {
      (void)fs.remove_file(dir + "/" + name + "/" + internal_catalog::kHeartbeatFile);
      (void)fs.remove_file(dir + "/" + name + "/" + internal_catalog::kOwnerFile);
    }
    if (st.ok() && !is_dir) internal_catalog::discard_entry(fs, entry);  // the empty temporary directory
  }
  if (!st.ok() && fs.exists(entry.tmp)) internal_catalog::discard_entry(fs, entry);
  return st;
}

}  // namespace
}  // namespace internal_manager

Status CheckpointManager::Impl::resolve_best_auto(const std::map<std::string, double>& metrics) {
  if (!best_auto_pending || metrics.empty()) return Status();
  const std::string& metric = metrics.begin()->first;
  DISTCKPT_ASSIGN_OR_RETURN(CompareRule r, cfg.save_best_rule(0, metric));
  bests.push_back({metric, r});
  best_auto_pending = false;
  return Status();
}

void CheckpointManager::Impl::load_best(BestTracker& t) {
  if (t.loaded) return;
  t.loaded = true;
  t.value = std::nan("");
  t.name.clear();
  auto listing = list_checkpoints(cfg.directory, {.fs = fs, .key = cfg.encryption.key});
  if (!listing.ok()) return;
  const std::string head = "best_" + internal_manager::best_file_metric(t.metric) + "_";
  std::vector<std::pair<std::string, double>> found;
  for (const auto& e : listing->entries) {
    if (e.state != EntryState::kCommitted || e.name.rfind(head, 0) != 0) continue;
    if (!names.matches(series, e.name.substr(head.size()))) continue;  // another run's
    auto info = read_checkpoint_info(cfg.directory + "/" + e.name, {.fs = fs, .key = cfg.encryption.key});
    if (!info.ok()) continue;
    if (auto v = internal_manager::numeric_info(info->info, t.metric)) found.emplace_back(e.name, *v);
  }
  for (const auto& [name, v] : found)
    if (t.name.empty() || (t.rule == CompareRule::kGreater ? v > t.value : v < t.value)) t.name = name, t.value = v;
  // A crash between a best commit and the removal of the one it replaced left two.
  for (const auto& [name, v] : found)
    if (name != t.name) (void)internal_catalog::retire_checkpoint(*fs, cfg.directory, name);
}

std::string CheckpointManager::Impl::best_values(const std::map<std::string, double>& metrics) const {
  std::string lines;
  for (const auto& t : bests)
    if (auto it = metrics.find(t.metric); it != metrics.end()) {
      char value[64];
      std::snprintf(value, sizeof(value), "%.17g", it->second);
      lines += (lines.empty() ? "" : "\n") + t.metric + "\t" + value;
    }
  return lines;
}

Status CheckpointManager::Impl::save_bests(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                                           StepOutcome* out) {
  if (cfg.save_best.empty()) return Status();
  // Rank 0 decides which metrics improved; everyone gets "metric\tvalue" lines.
  std::string due;
  Status local;
  if (root()) {
    local = internal_base::guarded(where(), [&]() -> Status {
      DISTCKPT_RETURN_IF_ERROR(resolve_best_auto(metrics).with_context("save_best \"auto\""));
      for (auto& t : bests) {
        auto it = metrics.find(t.metric);
        if (it == metrics.end() || std::isnan(it->second)) continue;  // not reported; NaN is never better
        load_best(t);
        const double v = it->second;
        if (!t.name.empty() && !(t.rule == CompareRule::kGreater ? v > t.value : v < t.value)) continue;
        char value[64];
        std::snprintf(value, sizeof(value), "%.17g", v);
        due += (due.empty() ? "" : "\n") + t.metric + "\t" + value;
      }
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));
  comm->broadcast_string(due, 0);
  // The periodic save of this call, when a best copy can be its second name: committed
  // (not in flight) and holding what a best checkpoint holds.
  const bool can_link = out->saved && !out->in_flight && out->save_error.ok() && cfg.best_prefixes.empty() &&
                        std::find(out->committed.begin(), out->committed.end(), out->path) != out->committed.end();
  for (const auto& line : split(due, '\n')) {
    const std::size_t tab = line.rfind('\t');
    const std::string metric = line.substr(0, tab);
    const double value = std::strtod(line.c_str() + tab + 1, nullptr);
    std::string name = "best_" + internal_manager::best_file_metric(metric) + "_" + render(step, epoch);
    std::string path;
    bool linked = false;
    if (can_link) {
      // Rank 0 links; a file system without links (kUnsupported) gets a copy written.
      std::string linked_path;
      Status st;
      if (root()) {
        st = internal_base::guarded(where(), [&]() -> Status {
          const std::string ext(internal_format::driver(cfg.format).extension);
          std::string entry = name;
          for (int n = 1; fs->exists(path_of(entry)); ++n) entry = name + "_" + std::to_string(n);
          DISTCKPT_RETURN_IF_ERROR(internal_manager::link_checkpoint(*fs, cfg.directory, out->path, entry + ext,
                                                                     cfg.fsync, where()));
          name = entry;
          linked_path = path_of(entry);
          return Status();
        });
        if (!st.ok() && st.code() != StatusCode::kUnsupported && root())
          std::fprintf(stderr, "distckpt: %s: best copy by links failed, writing it: %s\n", where().c_str(),
                       st.to_string().c_str());
      }
      comm->broadcast_string(linked_path, 0);
      comm->broadcast_string(name, 0);
      linked = !linked_path.empty();
      path = linked_path;
    }
    if (!linked) {
      SaveKind best;
      best.update_latest = false;
      best.moves_last = false;
      best.name = name;
      best.best_of = metric;
      if (!cfg.best_prefixes.empty()) best.prefixes = &cfg.best_prefixes;
      best.info[metric] = InfoValue(value);
      StepOutcome saved;
      DISTCKPT_RETURN_IF_ERROR(save(step, epoch, metrics, "", best, &saved));
      out->committed.insert(out->committed.end(), saved.committed.begin(), saved.committed.end());
      if (!saved.save_error.ok()) {  // kContinue: reported, the previous best stays
        if (out->save_error.ok()) out->save_error = saved.save_error;
        continue;
      }
      path = saved.path;
      name = internal_base::base_name(path);
      const std::string ext(internal_format::driver(cfg.format).extension);
      if (!ext.empty() && name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0)
        name.resize(name.size() - ext.size());
    }
    out->best.push_back(path);
    // Rank 0: the new best replaces the previous one of its metric.
    if (root()) {
      for (auto& t : bests) {
        if (t.metric != metric) continue;
        const std::string previous = t.name.empty() ? "" : t.name + std::string(internal_format::driver(cfg.format).extension);
        t.name = name + std::string(internal_format::driver(cfg.format).extension);
        t.value = value;
        std::string removed;
        if (!previous.empty() && previous != t.name) {
          Status st = internal_catalog::retire_checkpoint(*fs, cfg.directory, previous);
          if (st.ok()) removed = previous;
          else std::fprintf(stderr, "distckpt: %s: removing the previous best: %s\n", where().c_str(), st.to_string().c_str());
        }
        nlohmann::ordered_json j;
        j["event"] = "best";
        j["metric"] = metric;
        j["value"] = value;
        j["step"] = step;
        j["name"] = internal_base::base_name(path);
        j["linked"] = linked;  // a second name of this step's save: no byte written again
        j["removed"] = removed;
        j["unix_ms"] = internal_manager::unix_ms_now();
        (void)internal_manager::append_stats_line(*fs, cfg.directory, j.dump());
      }
    }
  }
  return Status();
}

Result<std::string> CheckpointManager::best_checkpoint(const std::string& metric) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.check_usable());
  std::string path;
  Status local;
  if (impl.root()) {
    local = internal_base::guarded(impl.where(), [&]() -> Status {
      if (impl.cfg.save_best.empty()) return invalid_argument("best_checkpoint: save_best is not set");
      for (auto& t : impl.bests) {
        if (!metric.empty() && t.metric != metric) continue;
        impl.load_best(t);
        if (t.name.empty()) return not_found("best_checkpoint: no best checkpoint of '" + t.metric + "' yet");
        path = impl.cfg.directory + "/" + t.name;
        return Status();
      }
      if (metric.empty() || impl.best_auto_pending) return not_found("best_checkpoint: no metric reported yet (save_best \"auto\")");
      return invalid_argument("best_checkpoint: '" + metric + "' is not one of save_best's metrics");
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*impl.comm, local.with_context(impl.where())));
  impl.comm->broadcast_string(path, 0);
  return path;
}

}  // namespace distckpt
