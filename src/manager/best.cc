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
#include "catalog/references.h"
#include "catalog/owner.h"
#include "catalog/retire.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
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
  // Every best copy records its metric; the name's prefix is a fallback.
  if (auto it = info.find("best_of"); it != info.end())
    if (auto* m = std::get_if<std::string>(&it->second)) return numeric_info(info, *m) ? *m : "";
  for (const auto& [key, value] : info) {
    const std::string head = "best_" + best_file_metric(key) + "_";
    if (entry_name.size() > head.size() && entry_name.compare(0, head.size(), head) == 0 && numeric_info(info, key))
      return key;
  }
  return "";
}

namespace {

// Rank 0: commits the native checkpoint directory <dir>/<name> as hard links to the
// data files of the committed checkpoint `source`, with an index of its own: the
// source's, saying it is a best copy of `metric` (info "best_of"), that it does not move
// `latest`, and with its own commit sequence number (resealed with `key` when the
// checkpoint is encrypted: the index is authenticated as a whole; the chunks' identity
// does not include it). The commit protocol's temporary entry, fsyncs and no-replace
// rename. kUnsupported when the file system cannot link (the caller writes a copy).
Status link_checkpoint(FileSystem& fs, const std::string& dir, const std::string& source, const std::string& name,
                       const std::string& metric, const EncryptionKey* key, bool fsync, const std::string& who) {
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, internal_format::read_index(fs, source));
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  if (index.has_encryption()) {
    DISTCKPT_ASSIGN_OR_RETURN(cipher, internal_format::open_index(&index, key, source));
  }
  // An incremental checkpoint's copy references the same files: it is made under the
  // root's references lock (catalog/references.h), so that no retirement frees them
  // before it is committed, and only if its source is still the checkpoint read above.
  std::unique_ptr<internal_catalog::RootLock> references_lock;
  bool references = false;
  for (const auto& f : index.files()) references |= !f.checkpoint().empty();
  if (references) {
    DISTCKPT_ASSIGN_OR_RETURN(references_lock, internal_catalog::lock_references(fs, dir));
    auto again = internal_format::read_index(fs, source);
    if (!again.ok() || again->commit_seq() != index.commit_seq())
      return not_found("best copy of '" + source + "': it was retired or replaced meanwhile");
  }
  DISTCKPT_ASSIGN_OR_RETURN(internal_catalog::Entry entry, internal_catalog::begin_entry(fs, dir, name, true, who));
  if (references_lock) entry.before_rename = [&references_lock] { return references_lock->still_held(); };
  Status st = [&]() -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> children, fs.list_dir(source));
    for (const auto& c : children) {
      if (c.name == internal_format::kIndexFileName) continue;  // written afresh
      if (c.name == internal_format::kReferencedMarkerName) continue;  // the copy was no save's base
      if (c.is_dir) return unsupported("best copy of '" + source + "': a subdirectory '" + c.name + "'");
      DISTCKPT_RETURN_IF_ERROR(fs.link_file(source + "/" + c.name, entry.tmp + "/" + c.name));
    }
    index.set_name(name);
    index.set_advances_latest(false);
    index.set_commit_seq(entry.commit_seq);
    (*index.mutable_info())["best_of"].set_string_value(metric);
    index.mutable_info()->erase("epoch_end");  // as a written best copy: not an epoch's end save
    if (cipher) {
      const std::string salt = index.encryption().salt();
      DISTCKPT_RETURN_IF_ERROR(internal_format::seal_index(&index, *cipher, salt));
    }
    return internal_catalog::finish_entry(fs, entry, &index, fsync, /*update_latest=*/false).status();
  }();
  if (!st.ok() && fs.exists(entry.tmp)) internal_catalog::discard_entry(fs, entry);
  return st;
}

}  // namespace
}  // namespace internal_manager

Result<StepOutcome> CheckpointManager::step_end(int64_t step, int64_t epoch, const MetricsInOrder& metrics,
                                                bool epoch_end) {
  const std::map<std::string, double> by_name(metrics.values.begin(), metrics.values.end());
  impl_->first_metric = metrics.values.empty() ? "" : metrics.values.front().first;
  auto out = step_end(step, epoch, by_name, epoch_end);
  impl_->first_metric.clear();
  return out;
}

Result<StepOutcome> CheckpointManager::end(int64_t step, int64_t epoch, const MetricsInOrder& metrics, bool epoch_end) {
  const std::map<std::string, double> by_name(metrics.values.begin(), metrics.values.end());
  impl_->first_metric = metrics.values.empty() ? "" : metrics.values.front().first;
  auto out = end(step, epoch, by_name, epoch_end);
  impl_->first_metric.clear();
  return out;
}

Result<StepOutcome> CheckpointManager::save_now(int64_t step, int64_t epoch, const MetricsInOrder& metrics,
                                                const std::string& suffix) {
  const std::map<std::string, double> by_name(metrics.values.begin(), metrics.values.end());
  impl_->first_metric = metrics.values.empty() ? "" : metrics.values.front().first;
  auto out = save_now(step, epoch, by_name, suffix);
  impl_->first_metric.clear();
  return out;
}

Status CheckpointManager::Impl::resolve_best_auto(const std::map<std::string, double>& metrics) {
  if (!best_auto_pending || metrics.empty()) return Status();
  // MMEngine's "auto": the first metric reported (in the caller's order when it gave one).
  const std::string& metric = metrics.count(first_metric) ? first_metric : metrics.begin()->first;
  DISTCKPT_ASSIGN_OR_RETURN(CompareRule r, cfg.save_best_rule(0, metric));
  bests.push_back(BestTracker::of(metric, r));
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
    if (internal_manager::best_metric_of(e.name, info->info) != t.metric) continue;  // another metric's
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
      if (Status st = resolve_best_auto(metrics); !st.ok()) {
        best_auto_pending = false;  // reported once: no best checkpoints from now on
        return st.with_context("save_best \"auto\" (no best checkpoints will be kept)");
      }
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
  if (Status agreed = agree(*comm, local); !agreed.ok()) return save_failed(agreed, out);
  comm->broadcast_string(due, 0);
  // MMEngine's _save_checkpoint_with_step after a new best: a regular checkpoint of this
  // step, when the run has one already and this call made none (the same on every rank).
  if (!due.empty() && cfg.regular_at_best && !out->saved && regular_this_run && last_saved_step != step) {
    last_triggered = std::make_pair(step, epoch);  // a second step_end of the step saves no more
    DISTCKPT_RETURN_IF_ERROR(save(step, epoch, metrics, "", SaveKind(), out));
  }
  // The periodic save of this call, when a best copy can be its second name: committed
  // (not in flight) and holding what a best checkpoint holds.
  // (Native directories only: a single file's description is inside it, and would say
  // it moved `latest`.)
  const bool can_link = cfg.format == Format::kNative && out->saved && !out->in_flight && out->save_error.ok() &&
                        cfg.best_prefixes.empty() &&
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
          std::string entry = name;
          for (int n = 1; fs->exists(path_of(entry)); ++n) entry = name + "_" + std::to_string(n);
          DISTCKPT_RETURN_IF_ERROR(internal_manager::link_checkpoint(*fs, cfg.directory, out->path, entry, metric,
                                                                     cfg.encryption.key.get(), cfg.fsync, where()));
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
      best.info["best_of"] = InfoValue(metric);
      StepOutcome saved;
      DISTCKPT_RETURN_IF_ERROR(save(step, epoch, metrics, "", best, &saved));
      out->committed.insert(out->committed.end(), saved.committed.begin(), saved.committed.end());
      if (!saved.save_error.ok()) {  // kContinue: reported, the previous best stays
        if (out->save_error.ok()) out->save_error = saved.save_error;
        continue;
      }
      path = saved.path;
      name = internal_base::base_name(path);
      const std::string ext(internal_collective::entry_extension(cfg));
      if (!ext.empty() && name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0)
        name.resize(name.size() - ext.size());
    }
    out->best.push_back(path);
    // Rank 0: the new best replaces the previous one of its metric.
    if (root()) {
      for (auto& t : bests) {
        if (t.metric != metric) continue;
        const std::string previous = t.name;  // an entry name: with its extension
        t.name = name + std::string(internal_collective::entry_extension(cfg));
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
        (void)internal_manager::append_stats_line(*fs, cfg.directory, j);
      }
    }
  }
  return Status();
}

Result<std::string> CheckpointManager::best_checkpoint(const std::string& metric) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.enter_plain("best_checkpoint"));
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
