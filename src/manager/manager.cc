// CheckpointManager: policies on top of save/load (collective/, tools/), retention (retention.cc).
// Decisions that depend on time, signals or the file system are taken on rank 0 and
// broadcast; every public call ends with all ranks holding the same outcome.
#include "distckpt/manager.h"

#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <tuple>

#include "comm/agree.h"
#include "format/stored.h"
#include "manager/retention.h"
#include "catalog/commit.h"
#include "tools/convert.h"
#include "base/guard.h"
#include "base/timer.h"
#include "format/native/index_io.h"

namespace distckpt {

using internal_comm::agree;

namespace {

// Set by the handler, read by the loop's thread: the handler may run on any thread of
// the process, so it is a lock-free atomic (async-signal-safe), not a plain variable.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");
extern "C" void on_stop_signal(int signo) { g_signal.store(signo, std::memory_order_relaxed); }

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
  std::string last_saved_path;
  std::chrono::steady_clock::time_point last_save_time = std::chrono::steady_clock::now();  // rank 0's
  // The step (and epoch) whose state this rank's buffers hold: that of its last
  // step_end/end/save_now call, or of the checkpoint resumed.
  int64_t current_step = -1, current_epoch = -1;
  // After an exception on some rank: no collective call ever again (the failing rank is
  // rethrowing, or has given up on the others).
  bool finished = false;
  Result<StepOutcome> exception_outcome = not_found("checkpoint manager: no exception save on this rank");

  // What every collective call of the manager starts with: one allreduce, so that a
  // rank that caught an exception (save_after_exception) meets the others whichever
  // manager call they are in.
  struct Sync {
    bool signal = false, save_due = false, exception = false, timed_out = false;
    bool async_busy = false;  // some rank's background save is still running
    int64_t min_step = 0, max_step = 0;
    int failing_rank = -1;  // the lowest rank that threw
  };
  Sync sync(bool failing, double timeout_s) {
    std::vector<int64_t> v{g_signal.load(std::memory_order_relaxed) != 0 ? 1 : 0, 0, failing ? 1 : 0, -current_step, current_step,
                           failing ? -static_cast<int64_t>(comm->rank()) : INT64_MIN,
                           async && async->in_flight() ? 1 : 0};
    // Is a time-based save due (rank 0's clock decides for everyone)?
    if (root() && cfg.save_every_steps == 0 && cfg.save_every_seconds > 0) {
      const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time).count();
      v[1] = since >= cfg.save_every_seconds ? 1 : 0;
    }
    Sync s;
    if (!comm->allreduce_within(v, ReduceOp::kMax, timeout_s)) {
      s.timed_out = true;
      return s;
    }
    s.signal = v[0] != 0;
    s.save_due = v[1] != 0;
    s.exception = v[2] != 0;
    s.min_step = -v[3];
    s.max_step = v[4];
    if (s.exception) s.failing_rank = static_cast<int>(-v[5]);
    s.async_busy = v[6] != 0;
    return s;
  }
  Status check_usable() const {
    if (finished)
      return aborted(where() + ": finished after an exception in the training loop; no further calls are made");
    return Status();
  }
  // The start of step_end/end/save_now: the buffers now hold `step`'s state; meet the
  // other ranks (and a rank that caught an exception).
  Result<Sync> enter(int64_t step, int64_t epoch) {
    DISTCKPT_RETURN_IF_ERROR(check_usable());
    current_step = step;
    current_epoch = epoch;
    return sync(false, -1);
  }
  Result<StepOutcome> after_exception(const Sync& s, const std::string& what);
  Result<std::vector<std::string>> publish_on_root(const std::vector<std::string>& sources);
  std::string best_checkpoint() const;

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
  // Rank 0: this series' committed checkpoints with their best_metric values.
  std::vector<internal_manager::SeriesEntry> series_with_metrics(const RootListing& listing) const {
    std::vector<internal_manager::SeriesEntry> entries;
    for (const auto& e : series_entries(series, listing)) {
      // Exception saves do not move `latest`: retention neither counts nor deletes them.
      if (!e.advances_latest) continue;
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
    return entries;
  }

  std::vector<std::string> retain(std::vector<std::string>* warnings) {
    auto listing = list_checkpoints(cfg.directory, fs);
    if (!listing.ok()) {
      warnings->push_back("retention: " + listing.status().to_string());
      return {};
    }
    std::vector<internal_manager::SeriesEntry> entries = series_with_metrics(*listing);
    internal_manager::RetentionPolicy policy{cfg.keep_max, cfg.keep_per_n_minutes,
                                             cfg.best_metric.empty() ? 0 : cfg.keep_best, rule};
    std::vector<std::string> removed;
    for (const auto& name : internal_manager::retention_deletes(std::move(entries), policy)) {
      Status st = remove_checkpoint(name);
      if (st.ok()) removed.push_back(name);
      else warnings->push_back("retention: " + st.to_string());
    }
    // What a crash in an earlier removal of this series left behind. Checkpoint names
    // cannot contain ".tmp-" and saves use ".tmp-<16 hex>", so only retention makes these.
    static const std::regex trash_re(R"((.+)\.tmp-deleting-[0-9a-f]{16})");
    if (auto all = fs->list_dir(cfg.directory); all.ok())
      for (const auto& e : *all) {
        std::smatch m;
        if (std::regex_match(e.name, m, trash_re) && std::regex_match(m[1].str(), series_regex(series)))
          (void)fs->remove_all(cfg.directory + "/" + e.name);
      }
    return removed;
  }

  // A crash must never leave a listed checkpoint half deleted (its index without all its
  // data): the checkpoint is first renamed, atomically and durably, to
  // "<name>.tmp-deleting-<id>" (listed as in flight, never resumed from), then removed.
  Status remove_checkpoint(const std::string& name) {
    const std::string tmp = internal_runtime::make_tmp_dir_name(cfg.directory, name);  // <dir>/<name>.tmp-<hex>
    const std::size_t at = tmp.rfind(internal_storage::kTmpMarker) + std::strlen(internal_storage::kTmpMarker);
    const std::string trash = tmp.substr(0, at) + "deleting-" + tmp.substr(at);
    DISTCKPT_RETURN_IF_ERROR(fs->rename_no_replace(cfg.directory + "/" + name, trash));
    DISTCKPT_RETURN_IF_ERROR(fs->sync_dir(cfg.directory));
    return fs->remove_all(trash);
  }

  struct SaveKind {
    bool update_latest = true;
    bool metric_required = true;  // best_metric must be in the metrics (not after an exception)
    bool may_run_async = false;   // periodic saves, with async_save
    std::map<std::string, InfoValue> info;
  };
  // A save: its outcome goes into *out. Returns an error only for a failed save under
  // OnSaveFailure::kStop (identical on every rank); with kContinue the failure is in
  // out->save_error.
  Status save(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics, const std::string& suffix,
              const SaveKind& kind, StepOutcome* out);
  // The failure policy: kStop returns `error` (identical on every rank); kContinue
  // keeps the first one in `*reported` (a StepOutcome field) and goes on.
  Status apply_failure_policy(const Status& error, Status* reported) const {
    if (error.ok()) return Status();
    if (cfg.on_failure == OnSaveFailure::kStop) return error;
    if (reported->ok()) *reported = error;
    return Status();
  }
  Status save_failed(const Status& error, StepOutcome* out) const {
    return apply_failure_policy(error, &out->save_error);
  }

  // async_save: the background save in flight (the same on every rank: started and
  // completed by collective calls) and what its completion needs.
  std::unique_ptr<AsyncCheckpointer> async;
  struct Record {
    std::string name;
    int64_t step = 0, epoch = 0;
    double metric = 0;
    double blocking_s = 0;  // how long the loop was blocked by the save
    bool in_background = false;
  };
  std::optional<Record> in_flight;
  // Collective: waits for the save in flight, if any, and completes it as a
  // synchronous save completes (latest, retention, statistics), or reports its failure.
  // finish_in_flight() returns the background save's failure whatever the policy, so
  // that a breakpoint or final save can still be made before it is reported;
  // background_failed() then applies the policy (kStop: the error; kContinue:
  // StepOutcome::background_error).
  Status finish_in_flight(StepOutcome* out) {
    if (!in_flight) return Status();
    const Record record = *in_flight;
    in_flight.reset();
    auto saved = async->wait();  // identical on every rank: they agreed in the background
    if (!saved.ok()) return saved.status().with_context("background save '" + record.name + "'");
    return after_commit(*saved, record, /*apply_retention=*/true, out);
  }
  Status background_failed(const Status& error, StepOutcome* out) const {
    return apply_failure_policy(error, &out->background_error);
  }
  Status complete_async(StepOutcome* out) { return background_failed(finish_in_flight(out), out); }
  // complete_async() before publish/resume, which have no StepOutcome: a failure under
  // kContinue is printed (rank 0) instead.
  Status complete_async_quietly(const char* call) {
    StepOutcome out;
    DISTCKPT_RETURN_IF_ERROR(complete_async(&out));
    if (!out.background_error.ok() && root())
      std::fprintf(stderr, "distckpt: %s: %s\n", call, out.background_error.to_string().c_str());
    return Status();
  }
  // Collective, after a commit: statistics of the slowest and fastest writer, then
  // retention and the statistics line on rank 0.
  Status after_commit(const SaveResult& saved, const Record& record, bool apply_retention, StepOutcome* out);
};

Status CheckpointManager::Impl::save(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                                     const std::string& suffix, const SaveKind& kind, StepOutcome* out) {
  // One save at a time, committed and retained in order: a save in flight completes
  // first (this waits for it, and the wait counts in blocking_s).
  internal_runtime::Timer blocked;
  DISTCKPT_RETURN_IF_ERROR(complete_async(out));

  // Rank 0 picks a free name and reads the metric; everyone gets both.
  std::string name;
  double metric = std::nan("");
  Status local;
  if (root()) {
    name = render(step, epoch) + suffix;
    for (int n = 1; fs->exists(path_of(name)); ++n) name = render(step, epoch) + suffix + "_" + std::to_string(n);
    if (!cfg.best_metric.empty()) {
      auto it = metrics.find(cfg.best_metric);
      if (it == metrics.end() && !kind.metric_required) {
        // No metric for this save: it stays out of best-K.
      } else if (it == metrics.end())
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
    for (const TensorEntry& e : state->tensors())
      if (internal_runtime::name_selected(e.name, cfg.save_prefixes))
        DISTCKPT_RETURN_IF_ERROR(view.add_tensor(e.name, e.dtype, e.buffers, e.layout));
    for (const auto& [k, v] : state->info()) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    for (const auto& [k, v] : cfg.append_info) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    DISTCKPT_RETURN_IF_ERROR(view.set_info("step_num", InfoValue(step)));
    DISTCKPT_RETURN_IF_ERROR(view.set_info("epoch_num", InfoValue(epoch)));
    if (!cfg.best_metric.empty() && kind.metric_required)
      DISTCKPT_RETURN_IF_ERROR(view.set_info(cfg.best_metric, InfoValue(metric)));
    for (const auto& [k, v] : kind.info) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
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
  opts.update_latest = kind.update_latest;
  opts.fs = fs;
  opts.encryption = cfg.encryption;
  Record record{name, step, epoch, metric, 0, false};

  if (async && kind.may_run_async) {
    // Returns once this rank's share is staged; the view may go, the buffers may change.
    Status started = async->save_async(view, cfg.directory, opts);  // identical on every rank
    if (!started.ok()) return save_failed(started, out);
    record.blocking_s = blocked.seconds();
    record.in_background = true;
    in_flight = record;
    out->saved = true;
    out->in_flight = true;
    out->path = cfg.directory + "/" + name;
    if (root()) last_save_time = std::chrono::steady_clock::now();
    return Status();
  }
  auto saved = distckpt::save(*comm, view, cfg.directory, opts);  // identical outcome on every rank
  if (!saved.ok()) return save_failed(saved.status(), out);
  record.blocking_s = blocked.seconds();
  out->saved = true;
  out->path = saved->path;
  if (root()) last_save_time = std::chrono::steady_clock::now();
  return after_commit(*saved, record, kind.update_latest, out);
}

Status CheckpointManager::Impl::after_commit(const SaveResult& saved, const Record& record, bool apply_retention,
                                             StepOutcome* out) {
  last_saved_step = record.step;
  last_saved_path = saved.path;
  out->committed.push_back(saved.path);
  // Slowest and fastest writer, for the statistics.
  std::vector<int64_t> lo{static_cast<int64_t>(saved.write_s * 1e6)}, hi = lo;
  comm->allreduce(lo, ReduceOp::kMin);
  comm->allreduce(hi, ReduceOp::kMax);
  // Retention and statistics on rank 0, only now that the checkpoint is committed. The
  // listing holds committed checkpoints only, and the newest of them is never deleted;
  // with async_save no other save is in flight here (a save completes before the next
  // one starts), so the newest committed checkpoint is always there.
  std::string removed;
  if (root()) {
    std::vector<std::string> warnings;
    if (!saved.warning.empty()) warnings.push_back(saved.warning);
    auto retained = internal_runtime::guarded(where(), [&]() -> Result<std::vector<std::string>> {
      if (!apply_retention) return std::vector<std::string>{};
      return retain(&warnings);
    });
    if (!retained.ok()) warnings.push_back("retention: " + retained.status().to_string());
    const std::vector<std::string> gone = retained.ok() ? *retained : std::vector<std::string>{};
    removed = join(gone, '\n');
    nlohmann::ordered_json j;
    j["step"] = record.step;
    j["epoch"] = record.epoch;
    j["name"] = record.name;
    j["path"] = saved.path;
    j["format"] = std::string(format_name(cfg.format));
    j["bytes"] = saved.bytes_written;
    j["index_bytes"] = saved.index_bytes;
    j["async"] = record.in_background;
    j["blocking_s"] = record.blocking_s;
    j["plan_s"] = saved.plan_s;
    j["write_s"] = saved.write_s;
    j["commit_s"] = saved.commit_s;
    j["write_s_fastest_rank"] = static_cast<double>(lo[0]) / 1e6;
    j["write_s_slowest_rank"] = static_cast<double>(hi[0]) / 1e6;
    if (!cfg.best_metric.empty())
      j[cfg.best_metric] = std::isnan(record.metric) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(record.metric);
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
  for (auto& name : split(removed, '\n')) out->removed.push_back(std::move(name));
  return Status();
}

CheckpointManager::CheckpointManager() = default;
CheckpointManager::~CheckpointManager() = default;
const std::string& CheckpointManager::series_prefix() const { return impl_->series; }
const CheckpointConfig& CheckpointManager::config() const { return impl_->cfg; }

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::create(Comm& comm, StateDict& state,
                                                                     CheckpointConfig config,
                                                                     std::unique_ptr<AsyncCheckpointer> async) {
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
  // Every rank must have been given one, or none (else some would create one alone).
  std::vector<int64_t> given{async ? 1 : 0, async ? 0 : 1};  // {some rank has one, some has none}
  comm.allreduce(given, ReduceOp::kMax);
  if (local.ok() && given[0] == 1 && given[1] == 1)
    local = invalid_argument("checkpoint manager: an AsyncCheckpointer was given on some ranks but not on others");
  if (local.ok() && async && !impl.cfg.async_save)
    local = invalid_argument("checkpoint manager: an AsyncCheckpointer was given but async_save is off");
  if (local.ok() && impl.cfg.async_save && !async && comm.mpi_comm_handle() == nullptr)
    local = unsupported("checkpoint manager: async_save needs an MPI communicator, or an AsyncCheckpointer given to create()");
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(impl.where())));
  if (impl.cfg.async_save && !async) {
    AsyncOptions options;
    options.staging_bytes = impl.cfg.async_staging_bytes;
    options.slab_bytes = impl.cfg.async_slab_bytes;
    // Collective; fails alike on every rank (same MPI thread level everywhere, then agreed).
    DISTCKPT_ASSIGN_OR_RETURN(async, AsyncCheckpointer::create(*static_cast<const MPI_Comm*>(comm.mpi_comm_handle()),
                                                              options));
  }
  impl.async = std::move(async);

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
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch));
  if (sync.exception) return impl.after_exception(sync, "");
  StepOutcome out;
  // A background save every rank has finished: complete it now (no waiting). Its
  // failure is reported after a breakpoint save, which must still be made.
  Status background = sync.async_busy ? Status() : impl.finish_in_flight(&out);
  if (sync.signal) {
    const Status waited = impl.finish_in_flight(&out);
    if (background.ok()) background = waited;
    // Synchronous: the job is about to stop.
    DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "_breakpoint", Impl::SaveKind(), &out));
    DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
    out.stop = true;
    return out;
  }
  DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
  const int64_t counter = cfg.by_epoch ? epoch : step;
  bool due = false;
  if (counter >= cfg.save_begin && (!cfg.by_epoch || epoch_end)) {
    if (cfg.save_every_steps > 0) due = counter % cfg.save_every_steps == 0;
    else due = sync.save_due;
  }
  if (!due) return out;
  Impl::SaveKind periodic;
  periodic.may_run_async = true;
  DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "", periodic, &out));
  return out;
}

Result<StepOutcome> CheckpointManager::end(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics) {
  Impl& impl = *impl_;
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch));
  if (sync.exception) return impl.after_exception(sync, "");
  StepOutcome out;
  // A save in flight completes first (this waits for it): it may be this very step. If
  // it failed, the final state is saved all the same before the failure is reported.
  const Status background = impl.finish_in_flight(&out);
  if (impl.cfg.save_last && impl.last_saved_step != step)
    DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "", Impl::SaveKind(), &out));
  DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
  // A failed final save (kContinue) publishes nothing: "the final checkpoint" is not there.
  if (!impl.cfg.publish_at_end || !out.save_error.ok()) return out;
  // The final checkpoint (this run's last save, else the newest) and the best one.
  std::vector<std::string> sources;
  if (impl.root()) {
    std::string last = impl.last_saved_path;
    if (last.empty()) {
      auto newest = resolve_checkpoint(impl.cfg.directory, impl.fs);
      if (newest.ok()) last = *newest;
    }
    if (!last.empty()) sources.push_back(last);
    const std::string best = impl.best_checkpoint();
    if (!best.empty() && best != last) sources.push_back(best);
  }
  auto published = impl.publish_on_root(sources);
  if (!published.ok()) {
    if (impl.cfg.on_failure == OnSaveFailure::kStop) return published.status();
    if (out.save_error.ok()) out.save_error = published.status();
    return out;
  }
  out.published = *published;
  return out;
}

Result<StepOutcome> CheckpointManager::save_now(int64_t step, int64_t epoch,
                                                const std::map<std::string, double>& metrics,
                                                const std::string& suffix) {
  Impl& impl = *impl_;
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch));
  if (sync.exception) return impl.after_exception(sync, "");
  StepOutcome out;
  Impl::SaveKind now;
  now.may_run_async = true;
  DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, suffix, now, &out));
  return out;
}

Result<StepOutcome> CheckpointManager::Impl::after_exception(const Sync& s, const std::string& what) {
  finished = true;
  std::string message = what;
  comm->broadcast_string(message, s.failing_rank);
  int64_t epoch = current_epoch;
  comm->broadcast(&epoch, sizeof(epoch), s.failing_rank);
  StepOutcome out;
  out.stop = true;
  out.exception_rank = s.failing_rank;
  out.exception = message;
  // A background save completes first, whatever the policy: its failure is reported,
  // and the exception save still runs.
  out.background_error = finish_in_flight(&out);
  const std::string head = "exception save: rank " + std::to_string(s.failing_rank) + " threw (" + message + ")";
  if (s.min_step != s.max_step) {
    out.save_error = aborted(head + " while the ranks' states were at different steps (" + std::to_string(s.min_step) +
                             " to " + std::to_string(s.max_step) + "): no consistent state to save");
    return out;
  }
  if (s.min_step < 0) {
    out.save_error = aborted(head + " before any step ended: nothing to save");
    return out;
  }
  SaveKind kind;
  kind.update_latest = false;  // a best-effort state: resume() takes it only when named
  kind.metric_required = false;
  kind.info["exception"] = InfoValue(message);
  kind.info["exception_rank"] = InfoValue(static_cast<int64_t>(s.failing_rank));
  const Status saved = save(s.min_step, epoch, {}, "_exception", kind, &out);
  if (!saved.ok()) out.save_error = saved;
  return out;
}

std::string CheckpointManager::Impl::best_checkpoint() const {
  if (cfg.best_metric.empty()) return "";
  auto listing = list_checkpoints(cfg.directory, fs);
  if (!listing.ok()) return "";
  const auto ranked = internal_manager::best_by_metric(series_with_metrics(*listing), rule);
  return ranked.empty() ? "" : cfg.directory + "/" + ranked.front();
}

Result<std::vector<std::string>> CheckpointManager::Impl::publish_on_root(const std::vector<std::string>& sources) {
  std::string paths;
  Status local;
  if (root()) {
    local = internal_runtime::guarded(where(), [&]() -> Status {
      for (const auto& src : sources) {
        PublishOptions options;
        options.format = cfg.publish_format;
        options.only = cfg.publish_only;
        options.fs = fs;
        options.key = cfg.encryption.key;
        DISTCKPT_ASSIGN_OR_RETURN(PublishResult published, publish_checkpoint(src, options));
        paths += (paths.empty() ? "" : "\n") + published.path;
      }
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));
  comm->broadcast_string(paths, 0);
  return split(paths, '\n');
}

void CheckpointManager::run(const std::function<void()>& loop) {
  if (!impl_->cfg.exception_save) return loop();
  try {
    loop();
  } catch (...) {
    std::string what = "unknown exception";
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    impl_->exception_outcome = save_after_exception(what);
    const auto& out = impl_->exception_outcome;
    const std::string result = !out.ok()              ? "no checkpoint saved: " + out.status().to_string()
                               : out->saved           ? "saved " + out->path
                               : !out->save_error.ok() ? "no checkpoint saved: " + out->save_error.to_string()
                                                       : "no checkpoint saved";
    std::fprintf(stderr, "distckpt: rank %d: an exception escaped the training loop (%s); %s\n", impl_->comm->rank(),
                 what.c_str(), result.c_str());
    throw;
  }
}

Result<StepOutcome> CheckpointManager::save_after_exception(const std::string& what) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.check_usable());
  const Impl::Sync sync = impl.sync(true, impl.cfg.exception_save_timeout_s);
  if (sync.timed_out) {
    impl.finished = true;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", impl.cfg.exception_save_timeout_s);
    return aborted(impl.where() + ": exception save: the other ranks did not reach the checkpoint manager within " +
                   seconds + " s (blocked in a collective of the training step?): nothing saved");
  }
  return impl.after_exception(sync, what);
}

Result<StepOutcome> CheckpointManager::last_exception_save() const { return impl_->exception_outcome; }

Result<std::string> CheckpointManager::publish(const std::string& target) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.check_usable());
  const Impl::Sync sync = impl.sync(false, -1);
  if (sync.exception) {
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, impl.after_exception(sync, ""));
    return aborted(impl.where() + ": publish: rank " + std::to_string(out.exception_rank) + " threw (" + out.exception +
                   ")");
  }
  DISTCKPT_RETURN_IF_ERROR(impl.complete_async_quietly("publish"));
  std::string source;
  Status local;
  if (impl.root()) {
    const std::string& dir = impl.cfg.directory;
    auto resolved = target.empty() ? resolve_checkpoint(dir, impl.fs)
                                   : Result<std::string>(target.find('/') != std::string::npos ? target : dir + "/" + target);
    if (resolved.ok()) source = *resolved;
    else local = resolved.status();
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*impl.comm, local.with_context(impl.where() + ": publish")));
  DISTCKPT_ASSIGN_OR_RETURN(std::vector<std::string> paths, impl.publish_on_root({source}));
  return paths.empty() ? std::string() : paths.front();
}

Result<ResumeResult> CheckpointManager::resume(const ResumeOptions& options) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.check_usable());
  {
    const Impl::Sync sync = impl.sync(false, -1);
    if (sync.exception) {
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, impl.after_exception(sync, ""));
      return aborted(impl.where() + ": resume: rank " + std::to_string(out.exception_rank) + " threw (" +
                     out.exception + ")");
    }
  }
  DISTCKPT_RETURN_IF_ERROR(impl.complete_async_quietly("resume"));
  const std::string& dir = impl.cfg.directory;
  ResumeResult result;
  std::string chosen, skipped;
  Status local;
  if (impl.root()) {
    local = internal_runtime::guarded(impl.where(), [&]() -> Status {
      // Candidates, best first: the target (or the newest), then older committed ones.
      DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(dir, impl.fs));
      // Implicit candidates (no target): the saves that move `latest` (not conversions or
      // published files) when there are any, as resolve_checkpoint does, and never an
      // exception save (a best-effort state: loaded only when named).
      const bool implicit = options.target.empty() && options.step < 0;
      static const std::regex exception_suffix("_exception(_[0-9]+)?(\\.[a-z0-9]+)?$");
      auto exception_save = [](const std::string& name) { return std::regex_search(name, exception_suffix); };
      bool any_advancing = false;
      for (const auto& e : listing.entries)
        any_advancing |= e.state == EntryState::kCommitted && e.advances_latest && (options.step < 0 || e.step == options.step);
      std::vector<CheckpointEntry> committed;
      for (const auto& e : listing.entries)
        if (e.state == EntryState::kCommitted && (options.step < 0 || e.step == options.step) &&
            (!implicit || ((!any_advancing || e.advances_latest) && !exception_save(e.name))))
          committed.push_back(e);
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
        if (newest.ok() && !exception_save(*newest)) candidates.push_back(*newest);
        else if (newest.ok() && committed.empty()) return Status();  // only exception saves: a fresh start
        else if (!newest.ok() && newest.status().code() == StatusCode::kNotFound) return Status();  // a fresh start
        else if (!newest.ok() && !options.fall_back_to_previous) return newest.status().with_context("resume");
      }
      for (const auto& e : committed) {
        const std::string path = dir + "/" + e.name;
        if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
      }
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (i > 0 && !options.fall_back_to_previous) break;
        VerifyOptions verify;
        verify.key = impl.cfg.encryption.key;
        Status ok = options.verify ? verify_checkpoint(candidates[i], verify, impl.fs).status()
                                   : read_checkpoint_info(candidates[i], impl.fs, impl.cfg.encryption.key).status();
        if (ok.ok()) {
          chosen = candidates[i];
          return Status();
        }
        // A wrong key, or a checkpoint not encrypted as configured, is no damage to fall
        // back from: an older checkpoint would fail alike, or be the downgrade itself. Those
        // fail on the index (no chunk read); a chunk failing authentication is damage.
        if (ok.code() == StatusCode::kAuthFailed) {
          Status index_level = read_checkpoint_info(candidates[i], impl.fs, impl.cfg.encryption.key).status();
          if (index_level.code() == StatusCode::kAuthFailed)
            return index_level.with_context("resume: '" + candidates[i] + "'");
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
  lo.key = impl.cfg.encryption.key;
  DISTCKPT_ASSIGN_OR_RETURN(LoadResult loaded, load(*impl.comm, *impl.state, chosen, lo));
  result.resumed = true;
  result.path = chosen;
  result.step = loaded.step;
  result.epoch = loaded.epoch;
  result.info = std::move(loaded.info);
  result.missing_in_checkpoint = std::move(loaded.missing_in_checkpoint);
  result.unexpected_in_checkpoint = std::move(loaded.unexpected_in_checkpoint);
  impl.last_saved_step = result.step;
  impl.current_step = result.step;
  impl.current_epoch = result.epoch;
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

bool CheckpointManager::signal_received() { return g_signal.load(std::memory_order_relaxed) != 0; }
void CheckpointManager::clear_signal() { g_signal.store(0, std::memory_order_relaxed); }

}  // namespace distckpt
