// CheckpointManager: policies on top of save/load (runtime/), retention (retention.cc).
// Decisions that depend on time, signals or the file system are taken on rank 0 and
// broadcast; every public call ends with all ranks holding the same outcome.
#include "distckpt/manager.h"

#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>

#include "comm/agree.h"
#include "format/stored.h"
#include "manager/retention.h"
#include "runtime/guard.h"
#include "storage/index_io.h"

namespace distckpt {

using internal_comm::agree;

namespace {

volatile sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int signo) { g_signal = signo; }

std::string regex_escape(const std::string& s) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(s, special, R"(\$&)");
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  if (s.empty()) return out;
  while (true) {
    const auto at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

std::string join(const std::vector<std::string>& v, char sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? std::string(1, sep) : "") + v[i];
  return out;
}

}  // namespace

struct CheckpointManager::Impl {
  Comm* comm = nullptr;
  StateDict* state = nullptr;
  CheckpointConfig cfg;
  CompareRule rule = CompareRule::kLess;
  std::string series;
  std::shared_ptr<FileSystem> fs = posix_filesystem();
  int64_t last_saved_step = -1;
  std::chrono::steady_clock::time_point last_save_time = std::chrono::steady_clock::now();  // rank 0's

  bool root() const { return comm->rank() == 0; }
  std::string where() const { return "checkpoint manager: rank " + std::to_string(comm->rank()); }

  // Names of this series: the template with its prefix, step and epoch as numbers, an
  // optional "_suffix" (breakpoint, collisions) and the format's extension.
  std::regex series_regex(const std::string& prefix) const {
    std::string pattern = regex_escape(cfg.name_template);
    pattern = replace_all(pattern, regex_escape("{prefix}"), regex_escape(prefix));
    pattern = replace_all(pattern, regex_escape("{step}"), "-?[0-9]+");
    pattern = replace_all(pattern, regex_escape("{epoch}"), "-?[0-9]+");
    return std::regex(pattern + "(_[A-Za-z0-9]+)?(\\.ckpt|\\.safetensors|\\.h5|\\.hdf5)?");
  }
  std::string render(int64_t step, int64_t epoch) const {
    std::string name = replace_all(cfg.name_template, "{prefix}", series);
    name = replace_all(name, "{step}", std::to_string(step));
    return replace_all(name, "{epoch}", std::to_string(epoch));
  }
  std::string path_of(const std::string& name) const {
    return cfg.directory + "/" + name + std::string(internal_format::format_extension(cfg.format));
  }

  // The committed checkpoints of `prefix`'s series under the directory (rank 0).
  std::vector<CheckpointEntry> series_entries(const std::string& prefix, const RootListing& listing) const {
    const std::regex re = series_regex(prefix);
    std::vector<CheckpointEntry> out;
    for (const auto& e : listing.entries)
      if (e.state == EntryState::kCommitted && std::regex_match(e.name, re)) out.push_back(e);
    return out;
  }

  // Rank 0: retention over this series after a commit. Returns the names removed; a
  // failure to remove one is a warning (the checkpoint stays, retention retries later).
  std::vector<std::string> retain(std::vector<std::string>* warnings) {
    auto listing = list_checkpoints(cfg.directory, fs);
    if (!listing.ok()) {
      warnings->push_back("retention: " + listing.status().to_string());
      return {};
    }
    std::vector<internal_manager::SeriesEntry> entries;
    for (const auto& e : series_entries(series, *listing)) {
      internal_manager::SeriesEntry s{e.name, e.commit_seq, e.created_unix_ms, std::nullopt};
      if (!cfg.best_metric.empty()) {
        auto info = read_checkpoint_info(cfg.directory + "/" + e.name, fs);
        if (info.ok()) {
          auto it = info->info.find(cfg.best_metric);
          if (it != info->info.end()) {
            if (auto* d = std::get_if<double>(&it->second)) s.metric = *d;
            else if (auto* i = std::get_if<int64_t>(&it->second)) s.metric = static_cast<double>(*i);
          }
        }
      }
      entries.push_back(std::move(s));
    }
    internal_manager::RetentionPolicy policy{cfg.keep_max, cfg.keep_per_n_minutes,
                                             cfg.best_metric.empty() ? 0 : cfg.keep_best, rule};
    std::vector<std::string> removed;
    for (const auto& name : internal_manager::retention_deletes(std::move(entries), policy)) {
      Status st = fs->remove_all(cfg.directory + "/" + name);
      if (st.ok()) removed.push_back(name);
      else warnings->push_back("retention: " + st.to_string());
    }
    return removed;
  }

  Result<StepOutcome> save(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                           const std::string& suffix);
};

Result<StepOutcome> CheckpointManager::Impl::save(int64_t step, int64_t epoch,
                                                  const std::map<std::string, double>& metrics,
                                                  const std::string& suffix) {
  // Rank 0 picks a free name and reads the metric; everyone gets both.
  std::string name;
  double metric = std::nan("");
  Status local;
  if (root()) {
    name = render(step, epoch) + suffix;
    for (int n = 1; fs->exists(path_of(name)); ++n) name = render(step, epoch) + suffix + "_" + std::to_string(n);
    if (!cfg.best_metric.empty()) {
      auto it = metrics.find(cfg.best_metric);
      if (it == metrics.end())
        local = invalid_argument("checkpoint manager: metric '" + cfg.best_metric +
                                 "' (best_metric) is missing from the metrics passed to step_end at step " +
                                 std::to_string(step));
      else
        metric = it->second;
    }
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));
  comm->broadcast_string(name, 0);
  comm->broadcast(&metric, sizeof(metric), 0);

  // What is saved: the tensors selected by save_prefixes, with the info values.
  StateDict view(state->rank());
  local = internal_runtime::guarded(where(), [&]() -> Status {
    for (const TensorEntry& e : state->tensors()) {
      bool wanted = cfg.save_prefixes.empty();
      for (const auto& p : cfg.save_prefixes) wanted |= e.name.rfind(p, 0) == 0;
      if (wanted) DISTCKPT_RETURN_IF_ERROR(view.add_tensor(e.name, e.dtype, e.buffers, e.layout));
    }
    for (const auto& [k, v] : state->info()) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    for (const auto& [k, v] : cfg.append_info) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    DISTCKPT_RETURN_IF_ERROR(view.set_info("step_num", InfoValue(step)));
    DISTCKPT_RETURN_IF_ERROR(view.set_info("epoch_num", InfoValue(epoch)));
    if (!cfg.best_metric.empty()) DISTCKPT_RETURN_IF_ERROR(view.set_info(cfg.best_metric, InfoValue(metric)));
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));

  SaveOptions opts;
  opts.name = name;
  opts.step = step;
  opts.epoch = epoch;
  opts.format = cfg.format;
  opts.integrated = cfg.integrated;
  opts.remove_redundancy = cfg.remove_redundancy;
  opts.fs = fs;
  auto saved = distckpt::save(*comm, view, cfg.directory, opts);  // identical outcome on every rank
  StepOutcome out;
  if (!saved.ok()) {
    if (cfg.on_failure == OnSaveFailure::kStop) return saved.status();
    out.save_error = saved.status();
    return out;
  }
  out.saved = true;
  out.path = saved->path;
  last_saved_step = step;
  if (root()) last_save_time = std::chrono::steady_clock::now();

  // Slowest and fastest writer, for the statistics.
  std::vector<int64_t> lo{static_cast<int64_t>(saved->write_s * 1e6)}, hi = lo;
  comm->allreduce(lo, ReduceOp::kMin);
  comm->allreduce(hi, ReduceOp::kMax);
  // Retention and statistics on rank 0, only now that the checkpoint is committed.
  std::string removed;
  if (root()) {
    std::vector<std::string> warnings;
    if (!saved->warning.empty()) warnings.push_back(saved->warning);
    auto retained = internal_runtime::guarded(where(), [&]() -> Result<std::vector<std::string>> {
      return retain(&warnings);
    });
    if (!retained.ok()) warnings.push_back("retention: " + retained.status().to_string());
    const std::vector<std::string> gone = retained.ok() ? *retained : std::vector<std::string>{};
    removed = join(gone, '\n');
    nlohmann::ordered_json j;
    j["step"] = step;
    j["epoch"] = epoch;
    j["name"] = name;
    j["path"] = saved->path;
    j["format"] = std::string(format_name(cfg.format));
    j["bytes"] = saved->bytes_written;
    j["index_bytes"] = saved->index_bytes;
    j["plan_s"] = saved->plan_s;
    j["write_s"] = saved->write_s;
    j["commit_s"] = saved->commit_s;
    j["write_s_fastest_rank"] = static_cast<double>(lo[0]) / 1e6;
    j["write_s_slowest_rank"] = static_cast<double>(hi[0]) / 1e6;
    if (!cfg.best_metric.empty()) j[cfg.best_metric] = std::isnan(metric) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(metric);
    j["removed"] = gone;
    j["warnings"] = warnings;
    j["unix_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string line = j.dump() + "\n";
    // Appended with O_APPEND semantics through a plain stream: one line per save.
    if (FILE* f = std::fopen((cfg.directory + "/stats.jsonl").c_str(), "a")) {
      std::fwrite(line.data(), 1, line.size(), f);
      std::fclose(f);
    }
  }
  comm->broadcast_string(removed, 0);
  out.removed = split(removed, '\n');
  return out;
}

CheckpointManager::CheckpointManager() = default;
CheckpointManager::~CheckpointManager() = default;
const std::string& CheckpointManager::series_prefix() const { return impl_->series; }
const CheckpointConfig& CheckpointManager::config() const { return impl_->cfg; }

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::create(Comm& comm, StateDict& state,
                                                                     CheckpointConfig config) {
  std::unique_ptr<CheckpointManager> m(new CheckpointManager());
  m->impl_ = std::make_unique<Impl>();
  Impl& impl = *m->impl_;
  impl.comm = &comm;
  impl.state = &state;
  impl.cfg = std::move(config);
  if (impl.cfg.fs) impl.fs = impl.cfg.fs;
  Status local = impl.cfg.validate();
  if (local.ok() && state.rank() != comm.rank())
    local = invalid_argument("checkpoint manager: the state dict was built for rank " + std::to_string(state.rank()));
  if (local.ok() && !impl.cfg.best_metric.empty()) impl.rule = *impl.cfg.effective_rule();
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(impl.where())));

  if (impl.root()) {
    local = internal_runtime::guarded(impl.where(), [&]() -> Status {
      FileSystem& fs = *impl.fs;
      const std::string& dir = impl.cfg.directory;
      DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(dir).with_context("checkpoint manager: directory"));
      // Writable? A probe file, created, synced and removed.
      const std::string probe = dir + "/.distckpt-probe.tmp-" + std::to_string(::getpid());
      Status probed = write_file_synced(fs, probe, "probe");
      (void)fs.remove_file(probe);
      if (!probed.ok()) return probed.with_context("checkpoint manager: directory '" + dir + "' is not writable");
      // A fresh series prefix when committed checkpoints of another run use ours.
      DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(dir, impl.fs));
      impl.series = impl.cfg.prefix;
      for (int n = 1; !impl.series_entries(impl.series, listing).empty(); ++n)
        impl.series = impl.cfg.prefix + "_" + std::to_string(n);
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(impl.series, 0);
  return m;
}

Result<StepOutcome> CheckpointManager::step_end(int64_t step, int64_t epoch,
                                                const std::map<std::string, double>& metrics, bool epoch_end) {
  Impl& impl = *impl_;
  const CheckpointConfig& cfg = impl.cfg;
  // One allreduce: did any rank get a stop signal; is a time-based save due (rank 0's clock).
  std::vector<int64_t> flags{g_signal != 0 ? 1 : 0, 0};
  if (impl.root() && cfg.save_every_steps == 0 && cfg.save_every_seconds > 0) {
    const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - impl.last_save_time).count();
    flags[1] = since >= cfg.save_every_seconds ? 1 : 0;
  }
  impl.comm->allreduce(flags, ReduceOp::kMax);
  if (flags[0] != 0) {
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, impl.save(step, epoch, metrics, "_breakpoint"));
    out.stop = true;
    return out;
  }
  const int64_t counter = cfg.by_epoch ? epoch : step;
  bool due = false;
  if (counter >= cfg.save_begin && (!cfg.by_epoch || epoch_end)) {
    if (cfg.save_every_steps > 0) due = counter % cfg.save_every_steps == 0;
    else due = flags[1] != 0;
  }
  if (!due) return StepOutcome{};
  return impl.save(step, epoch, metrics, "");
}

Result<StepOutcome> CheckpointManager::end(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics) {
  if (!impl_->cfg.save_last || impl_->last_saved_step == step) return StepOutcome{};
  return impl_->save(step, epoch, metrics, "");
}

Result<StepOutcome> CheckpointManager::save_now(int64_t step, int64_t epoch,
                                                const std::map<std::string, double>& metrics,
                                                const std::string& suffix) {
  return impl_->save(step, epoch, metrics, suffix);
}

Result<ResumeResult> CheckpointManager::resume(const ResumeOptions& options) {
  Impl& impl = *impl_;
  const std::string& dir = impl.cfg.directory;
  ResumeResult result;
  std::string chosen, skipped;
  Status local;
  if (impl.root()) {
    local = internal_runtime::guarded(impl.where(), [&]() -> Status {
      // Candidates, best first: the target (or the newest), then older committed ones.
      DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(dir, impl.fs));
      std::vector<CheckpointEntry> committed;
      for (const auto& e : listing.entries)
        if (e.state == EntryState::kCommitted && (options.step < 0 || e.step == options.step)) committed.push_back(e);
      std::sort(committed.begin(), committed.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
        return std::tie(a.commit_seq, a.created_unix_ms) > std::tie(b.commit_seq, b.created_unix_ms);
      });
      std::vector<std::string> candidates;
      if (!options.target.empty()) {
        const std::string path = options.target.find('/') != std::string::npos ? options.target : dir + "/" + options.target;
        if (!impl.fs->exists(path)) return not_found("resume: '" + path + "' does not exist");
        candidates.push_back(path);
      } else if (options.step >= 0) {
        if (committed.empty()) return not_found("resume: no committed checkpoint of step " + std::to_string(options.step) + " under '" + dir + "'");
      } else {
        auto newest = resolve_checkpoint(dir, impl.fs);
        if (newest.ok()) candidates.push_back(*newest);
        else if (newest.status().code() == StatusCode::kNotFound) return Status();  // a fresh start
        else if (!options.fall_back_to_previous) return newest.status().with_context("resume");
      }
      for (const auto& e : committed) {
        const std::string path = dir + "/" + e.name;
        if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
      }
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (i > 0 && !options.fall_back_to_previous) break;
        Status ok = options.verify ? verify_checkpoint(candidates[i], impl.fs).status()
                                   : read_checkpoint_info(candidates[i], impl.fs).status();
        if (ok.ok()) {
          chosen = candidates[i];
          return Status();
        }
        if (!options.fall_back_to_previous)
          return ok.with_context("resume: '" + candidates[i] + "' is damaged (set fall_back_to_previous to use an older one)");
        skipped += (skipped.empty() ? "" : "\n") + candidates[i];
      }
      return not_found("resume: no undamaged committed checkpoint under '" + dir + "'");
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*impl.comm, local));
  impl.comm->broadcast_string(chosen, 0);
  impl.comm->broadcast_string(skipped, 0);
  result.skipped = split(skipped, '\n');
  if (chosen.empty()) return result;

  LoadOptions lo;
  lo.strict = options.strict;
  lo.only = options.only;
  lo.fs = impl.fs;
  DISTCKPT_ASSIGN_OR_RETURN(LoadResult loaded, load(*impl.comm, *impl.state, chosen, lo));
  result.resumed = true;
  result.path = chosen;
  result.step = loaded.step;
  result.epoch = loaded.epoch;
  result.info = std::move(loaded.info);
  result.missing_in_checkpoint = std::move(loaded.missing_in_checkpoint);
  result.unexpected_in_checkpoint = std::move(loaded.unexpected_in_checkpoint);
  impl.last_saved_step = result.step;
  // Continue the series we resumed from (prefix or prefix_N), so retention sees it.
  std::string series = impl.series;
  if (impl.root()) {
    const std::string name = chosen.substr(chosen.find_last_of('/') + 1);
    for (int n = 0; n < 1000; ++n) {
      const std::string candidate = n == 0 ? impl.cfg.prefix : impl.cfg.prefix + "_" + std::to_string(n);
      if (std::regex_match(name, impl.series_regex(candidate))) {
        series = candidate;
        break;
      }
    }
  }
  impl.comm->broadcast_string(series, 0);
  impl.series = series;
  return result;
}

Status CheckpointManager::install_signal_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int signo : {SIGUSR1, SIGTERM})
    if (sigaction(signo, &sa, nullptr) != 0)
      return io_error(std::string("checkpoint manager: sigaction(") + strsignal(signo) + "): " + std::strerror(errno));
  return Status();
}

bool CheckpointManager::signal_received() { return g_signal != 0; }
void CheckpointManager::clear_signal() { g_signal = 0; }

}  // namespace distckpt
