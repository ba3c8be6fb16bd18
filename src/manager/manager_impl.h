// The checkpoint manager's state and the helpers its calls share. The calls are split
// by job: manager.cc (create, step_end, end, save_now, publish, saving and retention),
// resume.cc, exception.cc; with series.h (names), stats.h (stats.jsonl) and
// retention.h (which checkpoints to delete).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/test_seams.h"
#include "base/timer.h"
#include "collective/save_strategies.h"
#include "distckpt/inspect.h"
#include "distckpt/manager.h"
#include "format/format.h"
#include "manager/best.h"
#include "manager/retention.h"
#include "manager/series.h"
#include "manager/upload.h"
#include "tier/drain.h"

namespace distckpt {

// The flag the signal handlers set (manager.cc).
bool stop_signal_pending();

struct CheckpointManager::Impl {
  Comm* comm = nullptr;
  StateDict* state = nullptr;
  CheckpointConfig cfg;
  CompareRule rule = CompareRule::kLess;
  std::string series;  // the prefix of this run's names
  std::vector<std::string> gc_removed;  // rank 0: abandoned saves removed since the last stats line
  std::string spare_dir;  // this node's local-tier spares (given back by the destructor), or ""
  std::string job_id;  // the job's identity across requeues (config, $DISTCKPT_JOB_ID, $SLURM_JOB_ID), or ""
  internal_manager::SeriesNames names;
  std::shared_ptr<FileSystem> fs = posix_filesystem();
  int64_t last_saved_step = -1, last_saved_epoch = -1;
  // A regular checkpoint (one that moves the job's last) was committed by this manager:
  // MMEngine's last_ckpt, which a restart does not restore (regular_at_best).
  bool regular_this_run = false;
  std::string last_saved_path;
  std::chrono::steady_clock::time_point last_save_time = std::chrono::steady_clock::now();  // rank 0's
  // When the previous save started (retention's keep_per_n_minutes replays MindSpore's
  // window from it): the manager's creation before the first, as MindSpore's
  // ModelCheckpoint keeps it in memory. Rank 0's.
  int64_t previous_save_start_unix_ms = unix_ms_now();
  // Rank 0: when each of this manager's saves was committed, by listed name.
  std::map<std::string, int64_t> committed_unix_ms;
  // Rank 0: after a resume from a checkpoint older than its series' newest (a rewind, or a
  // fall back past damaged ones), the checkpoints of that series committed after it: the
  // abandoned branch, retired once the first save of the new branch is committed.
  std::vector<std::string> abandoned;
  // The (step, epoch) of the last periodic save step_end triggered: a second call for it
  // does not save again. The same on every rank.
  std::optional<std::pair<int64_t, int64_t>> last_triggered;
  // Rank 0: the committed checkpoints of this series committed after `resumed` (none when
  // the directory cannot be listed: the branch then stays).
  std::vector<std::string> newer_in_series(const std::string& resumed) const;
  static int64_t unix_ms_now() { return internal_base::wall_clock_ms(); }
  // The step (and epoch) whose state this rank's buffers hold: that of its last
  // step_end/end/save_now call, or of the checkpoint resumed.
  int64_t current_step = -1, current_epoch = -1;
  bool current_epoch_end = false;  // that call said the step ended an epoch (saved as info "epoch_end")
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
    bool uploads_done = false;  // rank 0 has upload outcomes to report
    int64_t min_step = 0, max_step = 0;
    int failing_rank = -1;  // the lowest rank that threw
    bool may_save = true;   // no failing rank called abort_after_error
  };
  Sync sync(bool failing, double timeout_s, bool may_save = true) {
    std::vector<int64_t> v{stop_signal_pending() ? 1 : 0, 0, failing ? 1 : 0, -current_step, current_step,
                           failing ? -static_cast<int64_t>(comm->rank()) : INT64_MIN,
                           async && async->in_flight() ? 1 : 0,
                           uploader && uploader->has_reports() ? 1 : 0,
                           may_save ? 0 : 1};
    // Is a time-based save due (rank 0's clock decides for everyone)?
    const int64_t every_steps = tiered() ? cfg.local_every_steps : cfg.save_every_steps;
    const double every_seconds = tiered() ? cfg.local_every_seconds : cfg.save_every_seconds;
    if (root() && every_steps == 0 && every_seconds > 0) {
      const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time).count();
      v[1] = since > every_seconds ? 1 : 0;  // MindSpore's strict >
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
    s.uploads_done = v[7] != 0;
    s.may_save = v[8] == 0;
    return s;
  }
  Status check_usable() const {
    if (finished)
      return aborted(where() + ": finished after an exception in the training loop; no further calls are made");
    return Status();
  }
  // The start of step_end/end/save_now: the buffers now hold `step`'s state; meet the
  // other ranks (and a rank that caught an exception).
  Result<Sync> enter(int64_t step, int64_t epoch, bool epoch_end) {
    DISTCKPT_RETURN_IF_ERROR(check_usable());
    current_step = step;
    current_epoch = epoch;
    current_epoch_end = epoch_end;
    Sync s = sync(false, -1);
    if (!s.exception && !s.timed_out && s.uploads_done) collect_uploads();
    return s;
  }
  // ---- the upload hook (manager/upload.h) ----
  std::unique_ptr<internal_manager::Uploader> uploader;  // rank 0, with upload/upload_command
  std::vector<std::string> uploads_ok, uploads_failed;  // collected, for the call's StepOutcome
  // Collective: rank 0's finished uploads go to stats.jsonl and every rank.
  void collect_uploads();
  // Rank 0. `at_end`: end()'s own uploads, the only ones with upload_at_end.
  void upload_after_commit(const std::string& path, bool at_end = false) {
    if (uploader && (at_end || !cfg.upload_at_end)) (void)uploader->enqueue(path, cfg.upload_wait_s);
  }
  void report_uploads(StepOutcome* out) {
    out->uploaded.insert(out->uploaded.end(), uploads_ok.begin(), uploads_ok.end());
    out->upload_errors.insert(out->upload_errors.end(), uploads_failed.begin(), uploads_failed.end());
    uploads_ok.clear();
    uploads_failed.clear();
  }
  Result<StepOutcome> after_exception(const Sync& s, const std::string& what);
  // save_after_exception and abort_after_error: meet the others as a failing rank.
  Result<StepOutcome> meet_after_exception(const std::string& what, bool may_save);
  // The start of the calls without a StepOutcome (resume, publish, best_checkpoint):
  // meet the other ranks; kAborted naming the rank that threw, after its exception save.
  Status enter_plain(const char* call) {
    DISTCKPT_RETURN_IF_ERROR(check_usable());
    const Sync s = sync(false, -1);
    if (!s.exception) return Status();
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, after_exception(s, ""));
    return aborted(where() + ": " + call + ": rank " + std::to_string(out.exception_rank) + " threw (" + out.exception +
                   ")");
  }
  Result<std::vector<std::string>> publish_on_root(const std::vector<std::string>& sources);
  std::string best_checkpoint() const;

  bool root() const { return comm->rank() == 0; }
  // Rank 0: the call's metrics, for stats.jsonl (internal_manager::metrics_line), whatever
  // the save policies. Buffered: flush_metrics() writes them before each save's line, at
  // end() and at destruction, or once 64 KiB wait; a crash loses those since the last
  // save. A failure is printed, never returned (statistics never fail a step).
  void log_metrics(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics);
  void flush_metrics();
  std::string pending_metrics;
  // Rank 0: the base of the next incremental save ("" for none; see save()).
  std::string incremental_base() const;
  // Rank 0: bytes retired checkpoints keep for incremental ones (the last sweep's).
  uint64_t retired_kept_bytes = 0;
  std::string where() const { return "checkpoint manager: rank " + std::to_string(comm->rank()); }

  // Names of this series (series.h): `series` is its prefix.
  std::string render(int64_t step, int64_t epoch) const { return names.render(series, step, epoch); }
  std::string path_of(const std::string& name) const {
    return cfg.directory + "/" + name + std::string(internal_collective::entry_extension(cfg));
  }

  // Rank 0: this series' committed checkpoints with their best_metric values.
  std::vector<internal_manager::SeriesEntry> series_with_metrics(const RootListing& listing) const {
    std::vector<internal_manager::SeriesEntry> entries;
    for (const auto& e : names.entries(series, listing)) {
      // Exception saves do not move `latest`: retention neither counts nor deletes them.
      if (!e.advances_latest) continue;
      internal_manager::SeriesEntry s{e.name, e.commit_seq, e.created_unix_ms, std::nullopt};
      if (!cfg.best_metric.empty()) {
        auto info = read_checkpoint_info(cfg.directory + "/" + e.name, {.fs = fs});
        if (info.ok()) s.metric = internal_manager::numeric_info(info->info, cfg.best_metric);
      }
      entries.push_back(std::move(s));
    }
    return entries;
  }

  // Rank 0: retention over this series after a commit. Returns the names removed; a
  // failure to remove one is a warning (the checkpoint stays, retention retries later).
  struct Record;  // a save as the manager remembers it (below)
  // Rank 0, after `record`'s commit (listed as `committed`): retires what the retention policies let go
  // (manager/retention.h); returns the names retired. Warnings for what failed.
  std::vector<std::string> retain(const Record& record, const std::string& committed,
                                  std::vector<std::string>* warnings);

  struct SaveKind {
    bool update_latest = true;
    bool metric_allowed = true;  // best_metric is read from the metrics when there (not after an exception)
    bool may_run_async = false;   // periodic saves, with async_save
    std::map<std::string, InfoValue> info;
    std::string name;             // "" : the series' name of the step (+ suffix)
    const std::vector<std::string>* prefixes = nullptr;  // null: save_prefixes
    bool moves_last = true;       // the job's last save (end() and save_last look at it); not a best copy
    std::string best_of;          // a best checkpoint of this metric (stats.jsonl)
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
    double metric = std::nan("");  // none unless the save had best_metric
    double blocking_s = 0;  // how long the loop was blocked by the save
    bool in_background = false;
    std::string tier = "global";  // "global", or "drain" (a local checkpoint drained)
    double drain_s = 0;
    bool moves_last = true;
    std::string best_of;
    std::map<std::string, double> metrics;  // the call's metrics (rank 0's), in its stats line
    int64_t decided_unix_ms = unix_ms_now();  // when the save was decided, before its write
    bool epoch_end = false;  // saved at the end of an epoch (moves `latest`): Caffe2's write(epoch)
  };
  std::optional<Record> in_flight;
  // ---- the metadata handler (metadata.cc; CheckpointConfig::metadata_handler) ----
  // Rank 0: a warning on stderr and in stats.jsonl.
  void metadata_warning(const std::string& what) const;
  // Collective, at create(): whether rank 0 has a handler (has_metadata_handler, on every
  // rank); rank 0 calls its set_params.
  void metadata_set_params();
  bool has_metadata_handler = false;
  // Rank 0, after resume() adopted another series: set_params again, with it.
  void metadata_params_changed();
  // Collective: rank 0's cp_accessible(); false fills out->skipped (a warning).
  bool metadata_accessible(StepOutcome* out);
  // Rank 0, after a commit that moves `latest`: write() and report("checkpoint_save").
  void metadata_after_commit(const Record& record, const SaveResult& saved) const;
  // Collective: rank 0's last_epoch(user_epoch), agreed.
  Result<std::optional<int64_t>> metadata_last_epoch(int64_t user_epoch);
  // Rank 0, after a resume that loaded: report("checkpoint_load").
  void metadata_report_load(const ResumeResult& result, double seconds) const;
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
    if (record.tier == "local") {  // a local-tier save (save_tiered)
      auto saved = async->wait_local();
      if (!saved.ok()) return saved.status().with_context("background local save '" + record.name + "'");
      return after_local_commit(*saved, record, /*final_save=*/false, out);
    }
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

  // ---- the local tier (manager/tiers.cc) ----
  bool tiered() const { return !cfg.local.dir.empty(); }
  // How many of the newest (global) checkpoints retention keeps: keep_global with a
  // local tier when set, else keep_max (0: none by count).
  int keep_newest() const { return tiered() && cfg.keep_global >= 0 ? cfg.keep_global : cfg.keep_max; }
  int64_t local_saves = 0;
  std::unique_ptr<internal_tier::DrainJob> drain;  // in flight, the same on every rank
  Record drain_record;
  std::string pending_drain;  // due while another drain ran: the newest such
  Record pending_record;
  // Collective: a local save of `view`, its retention and statistics, and the drain
  // the policy asks for (now, for saves that are not periodic).
  Status save_tiered(const StateDict& view, const SaveOptions& opts, Record record, const SaveKind& kind,
                     internal_base::Timer& blocked, StepOutcome* out);
  // Collective: completes a drain every rank has finished (or waits for it), then
  // starts a pending one.
  Status poll_drain(bool wait, StepOutcome* out);
  Status start_drain(const Record& record, StepOutcome* out);
  // Collective, after a local commit: local retention, the statistics line, and the
  // drain the policy asks for (now and waited for, for a final save).
  Status after_local_commit(const LocalSaveResult& saved, const Record& record, bool final_save, StepOutcome* out);
  // Collective: local retention (records first, then every node's files, and what
  // failed saves left on the nodes).
  std::vector<std::string> retain_local(std::vector<std::string>* warnings);
  // Every node's leader removes the node's spare files (LocalTier::recycle): the job is
  // done with the local tier.
  void drop_spares();
  Result<ResumeResult> resume_tiered(const ResumeOptions& options);
  Result<StepOutcome> end(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics, bool epoch_end);
  Result<ResumeResult> resume_global(const ResumeOptions& options);  // resume.cc
  // resume_global's steps (resume.cc), rank 0: the candidates by the call's rule, then
  // the first that verifies.
  struct ResumeCandidates;
  Result<ResumeCandidates> resume_candidates(const ResumeOptions& options);
  Status choose_candidate(const ResumeOptions& options, const ResumeCandidates& found, std::string* chosen,
                          std::string* skipped, double* verify_s);

  // ---- best checkpoints (CheckpointConfig::save_best; manager/best.cc) ----
  struct BestTracker {
    std::string metric;
    CompareRule rule = CompareRule::kLess;
    bool loaded = false;          // read back from the directory for the current series
    double value = std::nan("");  // the best value so far (NaN: none yet)
    std::string name;             // its checkpoint's entry name, "" when none
    static BestTracker of(std::string metric, CompareRule rule) {
      BestTracker t;
      t.metric = std::move(metric);
      t.rule = rule;
      return t;
    }
  };
  std::vector<BestTracker> bests;  // rank 0 only
  bool best_auto_pending = false;  // rank 0: save_best = {"auto"}, no metric seen yet
  std::string first_metric;        // the first metric the current call reported in order ("" : name order)
  // Rank 0: turns "auto" into the first metric reported (kInvalidArgument when its rule
  // cannot be inferred).
  Status resolve_best_auto(const std::map<std::string, double>& metrics);
  // Rank 0: the best so far of `t.metric` in this series, from the directory (best
  // copies left by a crash between a commit and the removal are removed).
  void load_best(BestTracker& t);
  // Rank 0: the save_best metrics reported in `metrics`, as "name\tvalue" lines.
  std::string best_values(const std::map<std::string, double>& metrics) const;
  // Collective, after a call's own saves: commits the best checkpoints `metrics` call
  // for (linking the files of `out`'s periodic save when it is this step's and holds
  // what a best copy holds) and removes the ones they replace.
  Status save_bests(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics, StepOutcome* out);
  void forget_bests() {  // the series changed (resume adopted another)
    for (auto& t : bests) t.loaded = false;
  }
};

}  // namespace distckpt
