/// CheckpointConfig: what a CheckpointManager saves, when, and what it keeps.
///
/// The policies of MindSpore's CheckpointConfig/ModelCheckpoint, Caffe2's JobRunner and
/// MMEngine's CheckpointHook in one struct. How each save writes is the SaveSettings the
/// config is made of (format, encryption, fs, direct_io, ...: checkpoint.h), how resume
/// reads is `load` (LoadOptions), how background saves stage is `async` (AsyncOptions):
/// the manager fills in the rest of each call's options (names, steps, the key). Validate it with validate() (the manager
/// does, on every rank, and refuses to start on an error): every contradictory or
/// out-of-range option is an kInvalidArgument naming the option.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/async.h"
#include "distckpt/checkpoint.h"
#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"
#include "distckpt/tier.h"

namespace distckpt {

/// Which of two metric values is better (MMEngine's rule). kAuto infers it from the
/// metric's name: names containing acc, top, AR@, auc, precision, mAP, mDice, mIoU, mAcc
/// or aAcc are "greater", names containing loss are "less"; anything else is refused.
enum class CompareRule { kAuto, kGreater, kLess };

/// What a failed save does: kStop returns the error from step_end()/end() on every rank
/// (the training loop should stop); kContinue reports it on every rank in
/// StepOutcome::save_error, and training goes on (Caffe2 warns and continues). Either
/// way every rank sees the same outcome: no rank hangs.
enum class OnSaveFailure { kStop, kContinue };

/// Caffe2's metadata handler (JobRunner's checkpoint_manager): an object with its own
/// store of the checkpoints a job wrote (a job database, a scheduler's catalog). Set as
/// CheckpointConfig::metadata_handler. The manager calls it on rank 0 only (the other
/// ranks may leave it null), on the thread of the manager call that needs it, never two
/// calls at once, and broadcasts what it answers. Each method's default does what the
/// manager does without a handler. A handler that throws is caught: the call fails as the
/// method's comment says.
class MetadataHandler {
 public:
  virtual ~MetadataHandler() = default;
  /// Where the manager writes (Caffe2's set_params(db_prefix, db_type, node_names,
  /// path_prefix, path_type)): by CheckpointManager::create(), with the series prefix
  /// chosen, and again when resume() adopts the series it resumes from; `hosts` holds each
  /// node's host name once, in rank order.
  struct Params {
    std::string directory, prefix, format;
    std::vector<std::string> hosts;
  };
  virtual void set_params(const Params& params) { (void)params; }
  /// After each committed checkpoint saved at the end of an epoch (a step_end or end call
  /// with epoch_end, or save_at_start's epoch 0: Caffe2's JobRunner checkpoints only
  /// there), so that last_epoch() can answer with an epoch resume() finds: Caffe2's
  /// write(epoch). An error is a warning on stderr and in stats.jsonl (the checkpoint stays
  /// committed), and that save is not reported.
  virtual Status write(int64_t epoch, int64_t step, const std::string& path) {
    (void)epoch, (void)step, (void)path;
    return Status();
  }
  /// resume() without a target or step: which checkpoint to resume from (Caffe2's
  /// last_epoch(user_epoch)); `user_epoch` is ResumeOptions::epoch (-1: none given).
  /// std::nullopt: none, a fresh start; -1: the newest committed; >= 0: the checkpoint that
  /// ended that epoch. An error fails resume() on every rank.
  virtual Result<std::optional<int64_t>> last_epoch(int64_t user_epoch) {
    return std::optional<int64_t>(user_epoch);
  }
  /// Before each save that would move `latest` (Caffe2's cp_accessible(epoch=None)):
  /// false skips that save with a warning (StepOutcome::skipped); training goes on. An
  /// exception counts as false.
  virtual bool cp_accessible() { return true; }
  /// Caffe2's report(action_name, all_stats): after each committed save that moves
  /// `latest` ("checkpoint_save", after write()) and each resume that loaded
  /// ("checkpoint_load"): the checkpoint's path and how long it took. An error is a warning.
  virtual void report(const std::string& action, const std::string& path, double seconds) {
    (void)action, (void)path, (void)seconds;
  }
};

struct CheckpointConfig : SaveSettings {
  /// ---- when to save ----
  /// Save every N steps (0: not by steps). Steps win when both steps and seconds are
  /// set (as in MindSpore): seconds are then ignored.
  int64_t save_every_steps = 1;
  /// Save when at least T seconds passed since the last save (0: not by time). Measured
  /// on rank 0 and broadcast, so all ranks agree whatever their clocks.
  double save_every_seconds = 0;
  /// Count steps (false) or epochs (true, MMEngine's by_epoch): with by_epoch, "every N"
  /// applies to epochs, and a save happens at step_end calls with epoch_end = true.
  bool by_epoch = false;
  /// Periodic saves start here, as MMEngine's save_begin: at steps (epochs, with
  /// by_epoch) s >= save_begin with (s - save_begin) % every == 0, s being the number
  /// of completed steps passed to step_end. Negative: refused.
  int64_t save_begin = 0;
  /// Caffe2's JobRunner checkpoints after every epoch (N = 1): also save at the step_end
  /// calls with epoch_end = true whose epoch (completed epochs) is a multiple of N,
  /// whatever the step policy (0: not by epochs). Not with by_epoch, which already counts
  /// epochs.
  int64_t save_every_epochs = 0;
  /// Caffe2's JobRunner saves epoch 0 before training: resume() finding nothing to resume
  /// from saves the initial state as step 0, epoch 0, at the end of "epoch 0" (so that
  /// ResumeOptions::epoch = 0 restarts from it).
  bool save_at_start = false;
  /// end() saves the final state unless it was just saved.
  bool save_last = true;

  /// Incremental saves (SaveOptions::incremental): each periodic, breakpoint, final and
  /// exception save references the chunks it shares with this manager's previous save
  /// (or, after a restart, with the one `latest` names) instead of writing them again.
  /// Native sharded checkpoints, not encrypted, not with the local tier nor uploads (an
  /// uploaded directory would lack the files it references). Retention then
  /// retires a checkpoint whose files later ones reference by keeping exactly those
  /// files (catalog/references.h); `distckpt ls` lists it as "retired".
  bool incremental = false;

  /// ---- what to keep (a checkpoint is kept if any rule keeps it; the newest committed
  /// one is never deleted) ----
  /// As MindSpore's keep_checkpoint_max / keep_checkpoint_per_n_minutes:
  ///  keep_max > 0: the newest N periodic checkpoints; keep_per_n_minutes is ignored
  ///    (create() warns; MindSpore ignores it silently);
  ///  keep_max = 0, keep_per_n_minutes = N > 0: MindSpore's window, replayed: a save
  ///    decided less than N minutes after the previous save started retires the series'
  ///    checkpoints committed less than N minutes before the decision but the oldest
  ///    (the previous start is kept in memory: the manager's creation after a restart);
  ///  both 0: every checkpoint (MindSpore keeps 1 there).
  int keep_max = 5;
  double keep_per_n_minutes = 0;
  std::string best_metric;        ///< keep the best K by this metric ("" : off)
  CompareRule rule = CompareRule::kAuto;
  int keep_best = 1;

  /// ---- best checkpoints, as MMEngine's save_best keeps them ----
  /// For each metric named here, a checkpoint "best_<metric>_<name>" ('/' in the metric
  /// becomes '_') is committed whenever a step_end/end/save_now call reports a better
  /// value than the best so far (NaN never is); the previous best of that metric is then
  /// removed. The best so far is read back from the directory (each best checkpoint
  /// stores its value), so it survives a restart. {"auto"}: the first metric of the first
  /// call that reports any, in the caller's order (CheckpointManager::MetricsInOrder; the
  /// std::map forms report in name order; MMEngine: the first key of the evaluation's
  /// results). A best checkpoint never moves `latest`; periodic
  /// retention (keep_max, best_metric/keep_best) neither counts nor removes it. When the
  /// same call committed a periodic save of the whole state, the best checkpoint is a
  /// second name for its files (hard links: no byte written twice; a file system
  /// without links gets a copy written).
  std::vector<std::string> save_best;
  /// MMEngine's rule for them: empty (each inferred from its name, as for best_metric),
  /// one for all, or one per metric.
  std::vector<CompareRule> save_best_rules;
  /// MMEngine's greater_keys / less_keys: the names that infer kGreater / kLess (exact,
  /// then substring, case-insensitive). Empty: MMEngine's defaults (acc, top, AR@, auc,
  /// precision, mAP, mDice, mIoU, mAcc, aAcc / loss). Used for best_metric too.
  std::vector<std::string> greater_keys, less_keys;
  /// What a best checkpoint holds. Empty: what every save holds (save_prefixes), the
  /// optimizer state included, so that training can resume from it. {"model."} leaves
  /// the optimizer out, as MMEngine's best checkpoints do (save_optimizer=False); such a
  /// best checkpoint is then always written (its files differ from the periodic save's).
  std::vector<std::string> best_prefixes;
  /// MMEngine's _save_checkpoint_with_step after a new best: when a call commits a new
  /// best checkpoint, this manager has committed a regular checkpoint before (MMEngine's
  /// last_ckpt, which a restart does not restore), and the call made none of its step, a
  /// regular checkpoint of the step is saved too (it
  /// moves `latest` and counts for keep_max), so that a resume continues from the best
  /// step. Nothing is rewritten: a step that has one already gets none. On in mmengine().
  bool regular_at_best = false;

  /// ---- naming (the format, and every other way of writing, are the SaveSettings) ----
  std::string directory;                            ///< the checkpoint root (required)
  /// MMEngine's out_dir: checkpoints go to out_dir/basename(directory), as MMEngine joins
  /// out_dir with the work directory's name ("" or the directory itself, trailing '/'
  /// aside: directory itself).
  std::string out_dir;
  std::string prefix = "ckpt";                      ///< no '/', printable
  std::string name_template = "{prefix}-{epoch}_{step}";  ///< must contain {step} or {epoch}
  /// {step_in_epoch} in name_template is the step within its epoch, (step - 1) %
  /// steps_per_epoch + 1, as MindSpore names "{prefix}-{epoch}_{step_in_epoch}": set
  /// steps_per_epoch (its batch_num) for it; 0 otherwise.
  int64_t steps_per_epoch = 0;
  /// MMEngine's filename_tmpl ("iter_{}.pth", "epoch_{}.pth"): exactly one "{}", filled
  /// with the completed steps (the completed epochs with by_epoch), MMEngine's iter + 1 /
  /// epoch + 1; no other braces. It replaces name_template (setting both is refused) and
  /// has no prefix: the directory then holds one series, which runs continue. A trailing
  /// extension (".pth", ".ckpt", ...) is dropped: the format's own is added.
  std::string filename_tmpl;
  /// MindSpore's saved_network: every save writes this state dict (borrowed: it must
  /// outlive the manager, built for the same rank) instead of the one the manager was
  /// created with (e.g. the inference network of a training wrapper); resume() still
  /// loads into the managed one (set ResumeOptions::strict = false when it holds tensors
  /// the saved network lacks). null: the managed state.
  const StateDict* saved_network = nullptr;
  /// Save only tensors whose names start with one of these ("model." also names a tensor
  /// "model" itself; MMEngine's save_optimizer = false is {"model."}); empty: every tensor.
  std::vector<std::string> save_prefixes;
  /// Info values stored with every checkpoint, besides epoch_num and step_num (which
  /// are always stored) and, with best_metric, the metric.
  std::map<std::string, InfoValue> append_info;

  OnSaveFailure on_failure = OnSaveFailure::kStop;

  /// ---- two jobs, and abandoned saves, in one directory ----
  /// The job's identity across requeues: a requeued job takes back its series, and an
  /// implicit resume() prefers the newest checkpoint of its own series to another job's.
  /// Empty: $DISTCKPT_JOB_ID, else $SLURM_JOB_ID, else none (a new run).
  std::string job_id;
  /// Before each save, rank 0 removes the temporary entries of saves whose owner is
  /// provably gone (distckpt gc): a process of this host that no longer runs, or an owner
  /// elsewhere whose heartbeat is older than this, by the file system's clock (>= 120).
  double gc_lease_s = 600;

  /// SaveSettings::encryption (MindSpore's enc_key / enc_mode) encrypts every checkpoint,
  /// and its key is used to resume and verify. SaveSettings::fs is the file system of
  /// every call (tests inject faults there).

  /// How resume() reads: replica_reads, check_partial_chunks. Its fs, key and `only`
  /// must be left empty and `strict` true: the manager uses fs, encryption.key and
  /// ResumeOptions (kInvalidArgument otherwise).
  LoadOptions load;

  /// ---- asynchronous saves (AsyncCheckpointer, async.h; MindSpore's async_save) ----
  /// Periodic saves (step_end, save_now) return once this rank's share of the state is
  /// copied into staging memory; a background thread writes and commits it. Its outcome,
  /// retention and statistics line come at the first manager call after every rank has
  /// finished it, or before the next save starts (which waits for it): StepOutcome's
  /// `committed` and `save_error` then report it. Breakpoint (signal), exception and
  /// final (end) saves are synchronous: the job is about to stop. Every format: single
  /// files (.ckpt, safetensors, HDF5) and integrated saves are gathered and written in
  /// the background from a copy of each rank's slices (AsyncCheckpointer::save_async
  /// states the memory). Needs MPI_THREAD_MULTIPLE (or an AsyncCheckpointer given to
  /// create()).
  bool async_save = false;
  AsyncOptions async;  ///< staging memory and slabs per rank

  /// ---- the node-local tier (tier.h) ----
  /// With local.dir set, periodic saves (step_end, save_now) go to each node's local
  /// tier, by local_every_steps / local_every_seconds (save_every_steps and
  /// save_every_seconds are then not used), and every global_every-th of them is drained
  /// to `directory` in the background while training and further local saves go on.
  /// Breakpoint, final (end), exception saves commit locally and are drained before the
  /// call returns (a requeued job may land on other nodes; batch systems often wipe
  /// /dev/shm between jobs): a failed drain is reported in StepOutcome::drain_error and
  /// the local copy stays. resume() restores from the fastest tier (restore()).
  /// keep_max (or keep_global when >= 0) applies to the global tier, keep_local to the
  /// local one; neither removes the newest checkpoint of its tier, nor a local one being
  /// drained. With async_save, periodic local saves return once staged and are
  /// written, protected and committed in the background. Native sharded saves only.
  LocalTier local;
  int64_t local_every_steps = 0;
  double local_every_seconds = 0;
  int global_every = 1;  ///< every Nth local save is drained (0: only the final ones)
  int keep_local = 2;    ///< >= 1
  int keep_global = -1;  ///< -1: keep_max

  /// ---- saves on exception (MindSpore's exception_save; see CheckpointManager::run) ----
  /// An exception escaping the training loop on some rank makes every rank save
  /// "<name>_exception" (when their states are at the same step) before it is rethrown.
  bool exception_save = false;
  /// How long the failing rank waits for the others to reach the manager. Ranks blocked
  /// in a collective of the training step never come: the rank then gives up (no save)
  /// and rethrows. The job must then end by MPI_Abort (or the exception terminating
  /// the process), not MPI_Finalize, which would wait for the others. The timeout needs
  /// a communicator that supports it (make_mpi_comm's does; the in-process test
  /// communicator waits without limit).
  double exception_save_timeout_s = 60;

  /// ---- publishing (MMEngine's published_keys; see publish_checkpoint) ----
  /// end() also exports the final checkpoint (with save_last, as MMEngine: this run's
  /// last save, else its series' newest) and the best: save_best's best copies when
  /// save_best is set, else best_metric's best one; each as one file named with its
  /// SHA-256, beside the checkpoints.
  bool publish_at_end = false;
  std::vector<std::string> publish_only;  ///< tensor names/prefixes, e.g. {"model."}; empty: all
  Format publish_format = Format::kSafetensors;

  /// ---- uploads (Caffe2's UploadTaskGroupBuilder) ----
  /// After each commit that moves `latest` (periodic, breakpoint and final saves, drains
  /// of the local tier) and each publish, rank 0 hands the checkpoint's path to `upload`
  /// (a callback) or runs `upload_command` (argv, the path appended as the last argument,
  /// spawned without a shell), on a thread of its own: one upload at a time, in commit
  /// order, at most upload_queue waiting (a commit that finds the queue full waits up to
  /// upload_wait_s, then skips that upload and reports it). Retention never removes a
  /// checkpoint whose upload is pending; end() waits up to upload_wait_s for the queue.
  /// Outcomes go to stats.jsonl ("event":"upload") and to the next manager call
  /// (StepOutcome::uploaded / upload_errors, identical on every rank); a failed upload is
  /// never fatal. The callback runs on the uploader's thread: it must be thread-safe with
  /// respect to the training loop, and an exception from it counts as a failure. Only rank
  /// 0's upload/upload_command is used: the other ranks may leave them unset.
  std::function<Status(const std::string& path)> upload;
  std::vector<std::string> upload_command;
  /// Caffe2's upload runs once, when the job ends: with this set, end() uploads this run's
  /// last checkpoint (and what it publishes) and no commit before it is uploaded.
  bool upload_at_end = false;
  int upload_queue = 4;
  double upload_wait_s = 600;

  /// Caffe2's metadata_handler (above); rank 0's is used. Shared: the caller may keep it.
  std::shared_ptr<MetadataHandler> metadata_handler;

  /// ---- a layer above the state dict ----
  /// Called on every rank, on the calling thread, each time the manager is about to save
  /// (a periodic, final, breakpoint, best or exception save), once the save is decided
  /// and before the state dict is read. It may replace the borrowed state dict's tensors
  /// and info values (distckpt.torch walks its application state again here, so that
  /// storage that changed since the last save is followed). A failure on any rank fails
  /// that save on every rank, as a failed write does (on_failure). `prefixes`: the
  /// tensor-name prefixes this save keeps (save_prefixes, or best_prefixes for a best
  /// checkpoint; empty: every tensor), so that the layer can describe only what is kept.
  std::function<Status(const std::vector<std::string>& prefixes)> before_save;

  /// Presets: a config holding one seed's defaults, for the caller to adjust. Local,
  /// cannot fail (validate() judges the result).
  /// MindSpore's CheckpointConfig and ModelCheckpoint: a save every step, keep the newest
  /// 5, prefix "CKP", one integrated .ckpt per save without the CRC-32 footer (crc_check
  /// off), remove_redundancy off. Named "CKP-{epoch}_{step_in_epoch}.ckpt" as MindSpore
  /// names them when `steps_per_epoch` (MindSpore's batch_num, the dataset's size) is
  /// given, else "CKP-{epoch}_{step}.ckpt".
  static CheckpointConfig mindspore(int64_t steps_per_epoch = 0);
  /// MMEngine's CheckpointHook: interval=-1 (no periodic save: set save_every_steps as its
  /// interval, which counts epochs with by_epoch), by_epoch, max_keep_ckpts=-1 (keep all),
  /// save_last, names "epoch_{}" (filename_tmpl; "iter_{}" is MMEngine's when by_epoch is
  /// false: set it with by_epoch), native sharded saves, a regular save at a new best
  /// (regular_at_best). MMEngine's best checkpoints hold no optimizer or scheduler state: a
  /// state dict does not say which tensors those are, so set best_prefixes to the model's
  /// (distckpt.torch's manager does it by object type).
  static CheckpointConfig mmengine();

  /// kInvalidArgument naming the first bad option. Local, thread-safe.
  Status validate() const;
  /// The helpers below are local and thread-safe (const reads of the config), like
  /// validate(). The name template in effect: name_template, or filename_tmpl translated
  /// to it; cannot fail.
  std::string effective_name_template() const;
  /// The rule for best_metric after inference (kGreater or kLess); kInvalidArgument
  /// when it cannot be inferred.
  Result<CompareRule> effective_rule() const;
  /// The rule for `metric` given `rule` (kAuto: inferred from the name with greater_keys
  /// and less_keys, as MMEngine does); kInvalidArgument when it cannot be inferred.
  Result<CompareRule> rule_for(const std::string& metric, CompareRule rule) const;
  /// The rule of save_best's i-th metric (or of the metric "auto" became, i = 0): the i-th
  /// rule given, the only one, or kAuto past their end; kInvalidArgument when it cannot
  /// be inferred.
  Result<CompareRule> save_best_rule(std::size_t i, const std::string& metric) const;
};

}  // namespace distckpt
