// CheckpointManager: policies on top of save/load (collective/, tools/). Decisions that
// depend on time, signals or the file system are taken on rank 0 and broadcast; every
// public call ends with all ranks holding the same outcome. This file: creation, the
// calls of the training loop, saving, retention and publishing; resume.cc and
// exception.cc hold the others (manager_impl.h).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/guard.h"
#include "base/strings.h"
#include "base/timer.h"
#include "catalog/claims.h"
#include "catalog/gc.h"
#include "catalog/listing.h"
#include "catalog/references.h"
#include "catalog/retire.h"
#include "format/native/index_codec.h"
#include "comm/agree.h"
#include "comm/mpi_interop.h"
#include "distckpt/convert.h"
#include "distckpt/mpi_async.h"
#include "manager/manager_impl.h"
#include "manager/stats.h"
#include "manager/upload.h"
#include "storage/spare_files.h"
#include "tier/nodes.h"
#include "tier/record.h"
#include "tools/convert.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt {

using internal_base::join;
using internal_base::split;
using internal_comm::agree;

namespace {

// Set by the handler, read by the loop's thread: the handler may run on any thread of
// the process, so it is a lock-free atomic (async-signal-safe), not a plain variable.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");
extern "C" void on_stop_signal(int signo) { g_signal.store(signo, std::memory_order_relaxed); }

}  // namespace

bool stop_signal_pending() { return g_signal.load(std::memory_order_relaxed) != 0; }

Status CheckpointManager::Impl::save(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                                     const std::string& suffix, const SaveKind& kind, StepOutcome* out) {
  // One save at a time, committed and retained in order: a save in flight completes
  // first (this waits for it, and the wait counts in blocking_s).
  internal_base::Timer blocked;
  DISTCKPT_RETURN_IF_ERROR(complete_async(out));
  // Caffe2's JobRunner asks its metadata handler first, and skips the save with a warning.
  if (kind.update_latest && has_metadata_handler && !metadata_accessible(out)) return Status();
  // MindSpore's save_checkpoint_seconds counts from when a save is decided.
  if (root() && kind.moves_last) last_save_time = std::chrono::steady_clock::now();

  // Rank 0 picks a free name and reads the metric; everyone gets both.
  std::string name, extra;
  double metric[2] = {std::nan(""), 0};  // the value, and whether it was reported
  Status local = Status();
  if (root()) local = internal_base::guarded(where(), [&]() -> Status {
    // What abandoned saves left in the directory goes first (best effort).
    (void)internal_base::guarded(where(), [&]() -> Status {
      internal_catalog::GcOptions gc;
      gc.lease_s = cfg.gc_lease_s;
      auto collected = internal_catalog::collect_garbage(*fs, cfg.directory, gc);
      if (!collected.ok()) return collected.status();
      for (const auto& e : collected->removed) gc_removed.push_back(e.name);
      return Status();
    });
    const std::string base = kind.name.empty() ? render(step, epoch) + suffix : kind.name;
    name = base;
    auto taken = [&](const std::string& n) {
      return fs->exists(path_of(n)) || (tiered() && fs->exists(internal_tier::record_path(cfg.directory, n)));
    };
    for (int n = 1; taken(name); ++n) name = base + "_" + std::to_string(n);
    // save_best's metrics go into every save's info, so that a best copy linked to a
    // periodic save carries its value.
    // (An "auto" whose rule cannot be inferred is save_bests' error, not this save's.)
    if (kind.metric_allowed && resolve_best_auto(metrics).ok()) extra = best_values(metrics);
    // A save without the metric (a periodic save between evaluations, a breakpoint on a
    // signal, an exception save) is made all the same and stays out of best-K: a loop
    // that reports its loss only when it evaluates must not lose its save to SIGTERM.
    if (!cfg.best_metric.empty() && kind.metric_allowed)
      if (auto it = metrics.find(cfg.best_metric); it != metrics.end()) metric[0] = it->second, metric[1] = 1;
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));
  comm->broadcast_string(name, 0);
  comm->broadcast_string(extra, 0);
  comm->broadcast(metric, sizeof(metric), 0);

  // A layer above may refresh the state dict now (CheckpointConfig::before_save).
  const std::vector<std::string>& prefixes = kind.prefixes ? *kind.prefixes : cfg.save_prefixes;
  if (cfg.before_save) {
    const Status refreshed = agree(*comm, internal_base::guarded(where(), [&] { return cfg.before_save(prefixes); }));
    if (!refreshed.ok()) return save_failed(refreshed.with_context("before_save"), out);
  }
  // What is saved: the tensors selected by save_prefixes, with the info values.
  StateDict view(state->rank());
  local = internal_base::guarded(where(), [&]() -> Status {
    const StateDict& source = cfg.saved_network ? *cfg.saved_network : *state;
    for (const TensorEntry& e : source.tensors())
      if (internal_tools::name_selected(e.name, prefixes))
        DISTCKPT_RETURN_IF_ERROR(view.add_view(e));
    // The metric is this save's or none: a value of that name in the state's info (an
    // older one) would rank a save made without the metric in best-K.
    auto is_metric = [&](const std::string& k) {
      return (!cfg.best_metric.empty() && k == cfg.best_metric) ||
             std::find(cfg.save_best.begin(), cfg.save_best.end(), k) != cfg.save_best.end();
    };
    // The counters first: a step_num or epoch_num of the state's info or append_info that
    // contradicts them replaces them here and makes save() refuse, naming both.
    DISTCKPT_RETURN_IF_ERROR(view.set_info("step_num", InfoValue(step)));
    DISTCKPT_RETURN_IF_ERROR(view.set_info("epoch_num", InfoValue(epoch)));
    for (const auto& [k, v] : source.info())
      if (!is_metric(k)) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    for (const auto& line : split(extra, '\n')) {
      const std::size_t tab = line.rfind('\t');
      if (tab != std::string::npos)
        DISTCKPT_RETURN_IF_ERROR(view.set_info(line.substr(0, tab), InfoValue(std::strtod(line.c_str() + tab + 1, nullptr))));
    }
    for (const auto& [k, v] : cfg.append_info) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    // The state at the end of epoch `epoch` (ResumeOptions::epoch looks for it).
    // (Saves that move `latest` only: not an exception save's best-effort state, not a
    // best copy.)
    if (current_epoch_end && kind.update_latest) DISTCKPT_RETURN_IF_ERROR(view.set_info("epoch_end", InfoValue(true)));
    if (!cfg.best_metric.empty() && metric[1] != 0)
      DISTCKPT_RETURN_IF_ERROR(view.set_info(cfg.best_metric, InfoValue(metric[0])));
    for (const auto& [k, v] : kind.info) DISTCKPT_RETURN_IF_ERROR(view.set_info(k, v));
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));

  SaveOptions opts;
  static_cast<SaveSettings&>(opts) = cfg;  // how every save writes
  opts.fs = fs;
  opts.name = name;
  opts.step = step;
  opts.epoch = epoch;
  opts.update_latest = kind.update_latest;
  if (cfg.incremental) {
    opts.incremental = true;
    // The base (rank 0's choice counts): this manager's previous save, else the newest
    // committed checkpoint of its series (after a restart), else none (a full save that
    // the next one can build on). Never another series' `latest`; a base that vanished
    // before the save reads it only costs a full save.
    opts.incremental_from_latest = false;
    opts.incremental_base_required = false;
    if (root()) opts.incremental_base = incremental_base();
  }
  Record record;
  record.name = name;
  record.step = step;
  record.epoch = epoch;
  record.metric = metric[0];
  record.moves_last = kind.moves_last;
  record.best_of = kind.best_of;
  record.epoch_end = current_epoch_end && kind.update_latest;
  record.metrics = metrics;
  if (tiered()) return save_tiered(view, opts, record, kind, blocked, out);

  if (async && kind.may_run_async) {
    // Returns once this rank's share is staged; the view may go, the buffers may change.
    Status started = async->save_async(view, cfg.directory, opts);  // identical on every rank
    if (!started.ok()) return save_failed(started, out);
    record.blocking_s = blocked.seconds();
    record.in_background = true;
    in_flight = record;
    out->saved = true;
    out->in_flight = true;
    out->path = path_of(name);  // what `committed` will name (single files: with the extension)
    return Status();
  }
  auto saved = distckpt::save(*comm, view, cfg.directory, opts);  // identical outcome on every rank
  if (!saved.ok()) return save_failed(saved.status(), out);
  record.blocking_s = blocked.seconds();
  out->saved = true;
  out->path = saved->path;
  return after_commit(*saved, record, kind.update_latest, out);
}

Status CheckpointManager::Impl::after_commit(const SaveResult& saved, const Record& record, bool apply_retention,
                                             StepOutcome* out) {
  // A drain commits an older local save's copy: the newest save stays the last one.
  if (record.moves_last) regular_this_run = true;
  if (record.tier != "drain" && record.moves_last) {
    last_saved_step = record.step;
    last_saved_epoch = record.epoch;
    last_saved_path = saved.path;
  }
  out->committed.push_back(saved.path);
  // Every rank's write time and bytes, for the statistics (slowest and fastest writer,
  // and per host: on several nodes the slow host is what a user looks for).
  const std::vector<std::string> writers =
      comm->gather(std::to_string(static_cast<int64_t>(saved.write_s * 1e6)) + " " +
                       std::to_string(saved.rank_bytes_written),
                   0);
  // Retention and statistics on rank 0, only now that the checkpoint is committed. The
  // listing holds committed checkpoints only, and the newest of them is never deleted;
  // with async_save no other save is in flight here (a save completes before the next
  // one starts), so the newest committed checkpoint is always there.
  std::string removed;
  if (root()) {
    std::vector<std::string> warnings;
    if (!saved.warning.empty()) warnings.push_back(saved.warning);
    auto retained = internal_base::guarded(where(), [&]() -> Result<std::vector<std::string>> {
      if (!apply_retention) return std::vector<std::string>{};
      upload_after_commit(saved.path);  // queued first: retention keeps what is pending
      return retain(record, internal_base::base_name(saved.path), &warnings);
    });
    if (!retained.ok()) warnings.push_back("retention: " + retained.status().to_string());
    if (apply_retention) metadata_after_commit(record, saved);
    const std::vector<std::string> gone = retained.ok() ? *retained : std::vector<std::string>{};
    removed = join(gone, '\n');
    flush_metrics();  // the steps' metrics before the save's line
    nlohmann::ordered_json j;
    j["step"] = record.step;
    j["epoch"] = record.epoch;
    j["name"] = record.name;
    j["path"] = saved.path;
    j["format"] = std::string(format_name(cfg.format));
    j["tier"] = record.tier;  // "global", or "drain": a local checkpoint written to the global tier
    if (record.tier == "drain") j["drain_s"] = record.drain_s;
    if (!record.best_of.empty()) j["best_of"] = record.best_of;
    j["bytes"] = saved.bytes_written;
    // New bytes on storage, and the checkpoint's data (incremental saves reference the rest).
    j["bytes_written"] = saved.bytes_written;
    j["bytes_logical"] = saved.bytes_written + saved.bytes_referenced;
    if (!saved.incremental_base.empty()) j["incremental_base"] = saved.incremental_base;
    // What retired checkpoints still hold for the ones that reference them.
    if (cfg.incremental) j["retired_kept_bytes"] = retired_kept_bytes;
    j["index_bytes"] = saved.index_bytes;
    j["async"] = record.in_background;
    j["blocking_s"] = record.blocking_s;
    j["plan_s"] = saved.plan_s;
    j["write_s"] = saved.write_s;
    j["commit_s"] = saved.commit_s;
    const internal_manager::WriterStats by_rank = internal_manager::writer_stats(*comm, writers);
    j["write_s_fastest_rank"] = by_rank.fastest_s;
    j["write_s_slowest_rank"] = by_rank.slowest_s;
    j["hosts"] = by_rank.hosts;
    if (!cfg.best_metric.empty())
      j[cfg.best_metric] = std::isnan(record.metric) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(record.metric);
    if (!record.metrics.empty()) j["metrics"] = internal_manager::metrics_json(record.metrics);
    j["removed"] = gone;
    j["gc_removed"] = gc_removed;
    gc_removed.clear();
    j["warnings"] = warnings;
    j["unix_ms"] = internal_manager::unix_ms_now();
    if (Status st = internal_manager::append_stats_line(*fs, cfg.directory, j); !st.ok() && root())
      std::fprintf(stderr, "distckpt: %s: stats: %s\n", where().c_str(), st.to_string().c_str());
  }
  comm->broadcast_string(removed, 0);
  for (auto& name : split(removed, '\n')) out->removed.push_back(std::move(name));
  return Status();
}

std::string CheckpointManager::Impl::incremental_base() const {
  const std::string internal = internal_format::kIndexFileName;
  if (!last_saved_path.empty() && fs->exists(last_saved_path + "/" + internal))
    return internal_base::base_name(last_saved_path);
  auto listing = list_checkpoints(cfg.directory, {.fs = fs});
  if (!listing.ok()) return "";
  const CheckpointEntry* newest = nullptr;
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted && e.format == Format::kNative && e.advances_latest &&
        names.matches(series, e.name) && (newest == nullptr || internal_catalog::newer(e, *newest, listing->latest)))
      newest = &e;
  return newest == nullptr ? "" : newest->name;
}

CheckpointManager::CheckpointManager() = default;
CheckpointManager::~CheckpointManager() {
  // end() gives the local tier's spares back; after a failure, an exception, or without
  // end(), every rank gives back its node's here (no collective in a destructor: ranks
  // of one node racing to remove the directory is harmless).
  // The path was worked out at create(): the Comm may be gone by now.
  if (impl_ && !impl_->spare_dir.empty()) internal_storage::drop_spares(*impl_->fs, impl_->spare_dir);
  if (impl_) impl_->flush_metrics();
}
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
  impl.fs = internal_storage::filesystem_for(impl.cfg.directory, impl.cfg.fs);  // s3:// roots: the object store's
  // Its .ckpt files encrypted whole are listed, ordered and resumed from as their plaintext.
  impl.fs = internal_format::with_key(impl.fs, impl.cfg.encryption.key.get());
  Status local = impl.cfg.validate();
  if (local.ok()) {
    // The config in effect (config() returns it): MMEngine's filename_tmpl as a name
    // template, and its out_dir joined with the directory's name.
    impl.cfg.name_template = impl.cfg.effective_name_template();
    impl.cfg.filename_tmpl.clear();
    if (!impl.cfg.out_dir.empty()) {
      auto trimmed = [](std::string d) {
        while (d.size() > 1 && d.back() == '/') d.pop_back();
        return d;
      };
      const std::string d = trimmed(impl.cfg.directory);
      // MMEngine joins only an out_dir other than the work directory.
      if (trimmed(impl.cfg.out_dir) != d) impl.cfg.directory = impl.cfg.out_dir + "/" + internal_base::base_name(d);
      impl.cfg.out_dir.clear();
    }
  }
  impl.names = internal_manager::SeriesNames(impl.cfg.name_template, impl.cfg.steps_per_epoch);
  if (local.ok() && state.rank() != comm.rank())
    local = invalid_argument("checkpoint manager: the state dict was built for rank " + std::to_string(state.rank()));
  if (local.ok() && impl.cfg.saved_network && impl.cfg.saved_network->rank() != comm.rank())
    local = invalid_argument("checkpoint manager: saved_network was built for rank " +
                             std::to_string(impl.cfg.saved_network->rank()));
  if (local.ok() && !impl.cfg.best_metric.empty()) impl.rule = *impl.cfg.effective_rule();
  // Every rank must have been given one, or none (else some would create one alone).
  std::vector<int64_t> given{async ? 1 : 0, async ? 0 : 1};  // {some rank has one, some has none}
  comm.allreduce(given, ReduceOp::kMax);
  if (local.ok() && given[0] == 1 && given[1] == 1)
    local = invalid_argument("checkpoint manager: an AsyncCheckpointer was given on some ranks but not on others");
  if (local.ok() && async && !impl.cfg.async_save)
    local = invalid_argument("checkpoint manager: an AsyncCheckpointer was given but async_save is off");
  if (local.ok() && impl.cfg.async_save && !async && !internal_comm::as_mpi(comm))
    local = unsupported("checkpoint manager: async_save needs an MPI communicator, or an AsyncCheckpointer given to create()");
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(impl.where())));
  if (impl.cfg.async_save && !async) {
    // Collective; fails alike on every rank (same MPI thread level everywhere, then agreed).
    DISTCKPT_ASSIGN_OR_RETURN(async, make_async_checkpointer(*internal_comm::as_mpi(comm), impl.cfg.async));
  }
  impl.async = std::move(async);
  if (impl.tiered())
    impl.spare_dir = internal_tier::spare_dir(internal_tier::node_dir(comm, impl.cfg.local.dir, comm.rank()));
  if (impl.root() && (impl.cfg.upload || !impl.cfg.upload_command.empty()))
    impl.uploader = std::make_unique<internal_manager::Uploader>(impl.cfg.upload, impl.cfg.upload_command,
                                                                 static_cast<std::size_t>(impl.cfg.upload_queue));
  if (impl.root())
    for (std::size_t i = 0; i < impl.cfg.save_best.size(); ++i) {
      if (impl.cfg.save_best[i] == "auto") impl.best_auto_pending = true;
      else impl.bests.push_back(Impl::BestTracker::of(impl.cfg.save_best[i], *impl.cfg.save_best_rule(i, impl.cfg.save_best[i])));
    }

  if (impl.root() && impl.keep_newest() > 0 && impl.cfg.keep_per_n_minutes > 0)
    std::fprintf(stderr, "distckpt: %s: keep_per_n_minutes (%g) is ignored because %s (%d) is set, as in "
                 "MindSpore; set it to 0 to keep one checkpoint per %g minutes\n",
                 impl.where().c_str(), impl.cfg.keep_per_n_minutes, impl.tiered() && impl.cfg.keep_global >= 0 ? "keep_global" : "keep_max",
                 impl.keep_newest(), impl.cfg.keep_per_n_minutes);
  if (impl.root()) {
    local = internal_base::guarded(impl.where(), [&]() -> Status {
      FileSystem& fs = *impl.fs;
      const std::string& dir = impl.cfg.directory;
      DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(dir).with_context(impl.where() + ": directory"));
      // Writable? A probe file, created, synced and removed.
      const std::string probe = dir + "/.distckpt-probe.tmp-" + std::to_string(::getpid());
      Status probed = write_file_synced(fs, probe, "probe");
      (void)fs.remove_file(probe);
      if (!probed.ok()) return probed.with_context(impl.where() + ": directory '" + dir + "' is not writable");
      // The series prefix: this job's own when it was requeued; otherwise one no other run
      // uses, claimed atomically so that two jobs starting together never share it.
      impl.job_id = impl.cfg.job_id;
      for (const char* var : {"DISTCKPT_JOB_ID", "SLURM_JOB_ID"})
        if (const char* v = std::getenv(var); impl.job_id.empty() && v != nullptr) impl.job_id = v;
      DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(dir, {.fs = impl.fs}));
      DISTCKPT_ASSIGN_OR_RETURN(impl.series,
                                internal_catalog::claim_series(fs, dir, impl.cfg.prefix, impl.job_id,
                                                               [&](const std::string& prefix) {
                                                                 // Without {prefix} in the names (filename_tmpl)
                                                                 // the directory holds one series, which runs continue.
                                                                 if (impl.cfg.name_template.find("{prefix}") == std::string::npos)
                                                                   return false;
                                                                 return !impl.names.entries(prefix, listing).empty();
                                                               }));
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(impl.series, 0);
  comm.broadcast_string(impl.job_id, 0);
  impl.metadata_set_params();
  return m;
}

Result<StepOutcome> CheckpointManager::step_end(int64_t step, int64_t epoch,
                                                const std::map<std::string, double>& metrics, bool epoch_end) {
  Impl& impl = *impl_;
  const CheckpointConfig& cfg = impl.cfg;
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch, epoch_end));
  if (sync.exception) return impl.after_exception(sync, "");
  impl.log_metrics(step, epoch, metrics);
  StepOutcome out;
  impl.report_uploads(&out);
  // A background save every rank has finished: complete it now (no waiting). Its
  // failure is reported after a breakpoint save, which must still be made.
  Status background = sync.async_busy ? Status() : impl.finish_in_flight(&out);
  if (sync.signal) {
    const Status waited = impl.finish_in_flight(&out);
    if (background.ok()) background = waited;
    // Synchronous: the job is about to stop.
    DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "_breakpoint", Impl::SaveKind(), &out));
    DISTCKPT_RETURN_IF_ERROR(impl.save_bests(step, epoch, metrics, &out));
    DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
    out.stop = true;
    return out;
  }
  DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
  // A drain every rank has finished: committed now, without waiting.
  if (impl.tiered()) DISTCKPT_RETURN_IF_ERROR(impl.poll_drain(/*wait=*/false, &out));
  const int64_t counter = cfg.by_epoch ? epoch : step;
  const int64_t every = impl.tiered() ? cfg.local_every_steps : cfg.save_every_steps;
  bool due = false;
  // MMEngine's every_n_train_iters / every_n_epochs with `start`: counted from save_begin.
  if (counter > 0 && counter >= cfg.save_begin && (!cfg.by_epoch || epoch_end)) {
    if (every > 0) due = (counter - cfg.save_begin) % every == 0;
    else due = sync.save_due;
  }
  // Caffe2's checkpoint_every_epochs, beside the step policy.
  if (epoch_end && cfg.save_every_epochs > 0 && epoch > 0 && epoch % cfg.save_every_epochs == 0) due = true;
  // step_end twice for one step saves once (MindSpore's _last_triggered_step).
  if (due && impl.last_triggered == std::make_pair(step, epoch)) due = false;
  if (due) {
    impl.last_triggered = std::make_pair(step, epoch);
    Impl::SaveKind periodic;
    periodic.may_run_async = true;
    DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "", periodic, &out));
  }
  DISTCKPT_RETURN_IF_ERROR(impl.save_bests(step, epoch, metrics, &out));
  return out;
}

Result<StepOutcome> CheckpointManager::end(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                                           bool epoch_end) {
  Result<StepOutcome> out = impl_->end(step, epoch, metrics, epoch_end);
  impl_->flush_metrics();
  if (!out.ok() || impl_->finished) return out;
  // The uploads of this run, waited for (up to upload_wait_s) and reported. Every rank
  // takes part in the collection (one broadcast) whatever its own config says: only rank
  // 0's hook runs, and the other ranks may leave theirs unset.
  // Caffe2's once-at-the-end upload: this run's last checkpoint (when it reached the global tier).
  if (impl_->uploader && impl_->cfg.upload_at_end && !impl_->last_saved_path.empty() &&
      impl_->fs->exists(impl_->last_saved_path))
    impl_->upload_after_commit(impl_->last_saved_path, /*at_end=*/true);
  if (impl_->uploader && !impl_->uploader->drain(impl_->cfg.upload_wait_s))
    std::fprintf(stderr, "distckpt: %s: end: uploads still pending after %g s\n", impl_->where().c_str(),
                 impl_->cfg.upload_wait_s);
  impl_->collect_uploads();
  impl_->report_uploads(&out.value());
  return out;
}

Result<StepOutcome> CheckpointManager::Impl::end(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics,
                                                 bool epoch_end) {
  Impl& impl = *this;
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch, epoch_end));
  if (sync.exception) return impl.after_exception(sync, "");
  impl.log_metrics(step, epoch, metrics);
  StepOutcome out;
  impl.report_uploads(&out);
  // A save in flight completes first (this waits for it): it may be this very step. If
  // it failed, the final state is saved all the same before the failure is reported.
  const Status background = impl.finish_in_flight(&out);
  if (impl.tiered()) DISTCKPT_RETURN_IF_ERROR(impl.poll_drain(/*wait=*/true, &out));
  // Whether the last save is at the local tier only: rank 0 looks, every rank follows
  // (ranks on other hosts may see another file system, or none, at that path).
  std::string local_only = "0";
  if (impl.root() && impl.tiered() && !impl.last_saved_path.empty() && !impl.fs->exists(impl.last_saved_path))
    local_only = "1";
  impl.comm->broadcast_string(local_only, 0);
  if (impl.cfg.save_last && impl.last_saved_step != step) {
    DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, "", Impl::SaveKind(), &out));
  } else if (local_only == "1") {
    // The last state was saved at the local tier only: drained before the job ends.
    Impl::Record last;
    last.name = internal_base::base_name(impl.last_saved_path);
    last.step = impl.last_saved_step;
    last.epoch = impl.last_saved_epoch;
    last.tier = "drain";
    Status drained = impl.start_drain(last, &out);
    if (drained.ok()) drained = impl.poll_drain(/*wait=*/true, &out);
    if (!drained.ok()) out.drain_error = drained.with_context("drain of '" + last.name + "' (the local copy stays)");
  }
  DISTCKPT_RETURN_IF_ERROR(impl.save_bests(step, epoch, metrics, &out));
  if (impl.tiered()) impl.drop_spares();  // no local save follows: their memory goes back
  DISTCKPT_RETURN_IF_ERROR(impl.background_failed(background, &out));
  // A failed final save (kContinue) publishes nothing: "the final checkpoint" is not there.
  if (!impl.cfg.publish_at_end || !out.save_error.ok()) return out;
  // The final checkpoint (with save_last, as MMEngine: this run's last save, else the
  // series' newest, never another job's) and the best one.
  std::vector<std::string> sources;
  if (impl.root()) {
    std::string last = impl.cfg.save_last ? impl.last_saved_path : "";
    if (impl.cfg.save_last && last.empty()) {
      auto newest = resolve_checkpoint(impl.cfg.directory, {.fs = impl.fs});
      if (newest.ok() && impl.names.matches(impl.series, internal_base::base_name(*newest))) last = *newest;
    }
    if (!last.empty()) sources.push_back(last);
    // The best: save_best's copies when there are (MMEngine publishes those), else
    // best-K's first.
    const std::string best = impl.bests.empty() ? impl.best_checkpoint() : "";
    if (!best.empty() && best != last) sources.push_back(best);
    for (auto& t : impl.bests) {  // save_best's, as MMEngine publishes its best checkpoints
      impl.load_best(t);
      const std::string path = t.name.empty() ? "" : impl.cfg.directory + "/" + t.name;
      if (!path.empty() && std::find(sources.begin(), sources.end(), path) == sources.end()) sources.push_back(path);
    }
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
  DISTCKPT_ASSIGN_OR_RETURN(const Impl::Sync sync, impl.enter(step, epoch, /*epoch_end=*/false));
  if (sync.exception) return impl.after_exception(sync, "");
  impl.log_metrics(step, epoch, metrics);
  StepOutcome out;
  impl.report_uploads(&out);
  Impl::SaveKind now;
  now.may_run_async = true;
  DISTCKPT_RETURN_IF_ERROR(impl.save(step, epoch, metrics, suffix, now, &out));
  DISTCKPT_RETURN_IF_ERROR(impl.save_bests(step, epoch, metrics, &out));
  return out;
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

void CheckpointManager::Impl::collect_uploads() {
  std::string text;  // "+path" or "-error" lines
  if (root() && uploader) {
    for (const auto& r : uploader->take_reports()) {
      nlohmann::ordered_json j;
      j["event"] = "upload";
      j["path"] = r.path;
      j["ok"] = r.status.ok();
      if (!r.status.ok()) j["error"] = r.status.to_string();
      j["upload_s"] = r.seconds;
      j["unix_ms"] = internal_manager::unix_ms_now();
      (void)internal_manager::append_stats_line(*fs, cfg.directory, j);
      std::string line = r.status.ok() ? "+" + r.path : "-" + r.status.to_string();
      for (char& c : line)
        if (c == '\n') c = ' ';
      text += line + "\n";
    }
  }
  comm->broadcast_string(text, 0);
  for (const auto& line : split(text, '\n')) {
    if (line.empty()) continue;
    (line[0] == '+' ? uploads_ok : uploads_failed).push_back(line.substr(1));
  }
}

}  // namespace distckpt
