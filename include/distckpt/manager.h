/// CheckpointManager: the checkpoint logic of a training loop in one object.
///
///   auto m = CheckpointManager::create(*comm, state, config);      // collective
///   auto r = m.value()->resume();                                   // newest committed, if any
///   for (step = r->step + 1; ...; ++step) {
///     train_step();
///     auto out = m.value()->step_end(step, epoch, {{"loss", loss}});   // decides, saves, retains
///     if (!out.ok() || out->stop) break;                            // error, or a signal: saved
///   }
///   m.value()->end(step, epoch, {{"loss", loss}});                   // the last state
///
/// Every call is collective over the manager's communicator: all ranks call it, in the
/// same order, from the thread that owns the communicator, and get the same result.
/// The exceptions say so in their comments: save_after_exception and abort_after_error
/// (called by the rank that caught, which meets the others in their manager calls),
/// last_exception_save, the
/// signal functions, series_prefix and the destructor.
/// Every decision that depends on time, signals or the file system is taken on rank 0
/// and broadcast. The state dict is borrowed: its buffers must stay valid and hold the
/// state of the step passed to step_end while the call runs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/async.h"
#include "distckpt/checkpoint.h"
#include "distckpt/comm.h"
#include "distckpt/config.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"
#include "distckpt/tier.h"

namespace distckpt {

struct StepOutcome {
  /// A save of this step was made: committed (sync), or started and staged (in_flight).
  bool saved = false;
  std::string path;                  ///< the checkpoint saved, if any
  /// async_save: `path` is being written in the background. A later call reports it in
  /// `committed` (or its failure as save_error, or as that call's error with kStop).
  bool in_flight = false;
  /// Checkpoints committed during this call, retention and statistics done: the
  /// synchronous save, and a background save that completed.
  std::vector<std::string> committed;
  std::vector<std::string> removed;  ///< checkpoints retention deleted after those commits
  /// A SIGUSR1 or SIGTERM reached some rank: a "<name>_breakpoint" checkpoint was
  /// committed (when `saved`) and the loop should end now.
  bool stop = false;
  /// With OnSaveFailure::kContinue, the error of this call's own save (identical on every
  /// rank); training may go on. With kStop the error is returned instead. After an
  /// exception, why no exception checkpoint was saved.
  Status save_error;
  /// async_save with kContinue: a background save started by an earlier call failed
  /// (identical on every rank). With kStop it is returned instead, after a breakpoint or
  /// final save of this call was made.
  Status background_error;
  /// An exception escaped the training loop on rank `exception_rank` (the lowest, when
  /// several threw): `stop` is set, the manager is finished on every rank (later calls
  /// return kAborted without communicating), and the loop must end without further
  /// collective calls: the failing rank is rethrowing. `exception` is its what().
  int exception_rank = -1;
  std::string exception;
  std::vector<std::string> published;  ///< end() with publish_at_end: the files written
  /// save_best: best checkpoints committed during this call (the previous best of each
  /// metric is removed).
  std::vector<std::string> best;
  /// The upload hook (CheckpointConfig::upload): uploads that finished since the last
  /// call, and the failures among them (or uploads skipped), identical on every rank.
  std::vector<std::string> uploaded;
  std::vector<std::string> upload_errors;
  /// With a local tier (CheckpointConfig::local): the save of this call went to the
  /// local tier ("local"); drains committed during this call (global paths); and a drain
  /// that failed (the local checkpoint stays; identical on every rank).
  /// A save that was due and was not made, and why (the metadata handler's cp_accessible
  /// said no); "" otherwise. Identical on every rank.
  std::string skipped;
  std::string tier = "global";
  std::vector<std::string> drained;
  Status drain_error;
};

struct ResumeOptions {
  /// "" : the newest committed checkpoint of the directory. Otherwise a checkpoint name
  /// under the directory, or a path.
  std::string target;
  int64_t step = -1;                  ///< >= 0: the newest committed checkpoint saved at this step
  /// >= 0: the newest committed checkpoint saved at the end of this epoch (by a call with
  /// epoch_end, or save_at_start's epoch 0), as Caffe2's resume_from_epoch; kNotFound
  /// naming the epochs that have one otherwise. Not with `step` or `target`.
  int64_t epoch = -1;
  bool verify = true;                 ///< read every byte and check it before loading
  /// A damaged target: try older committed ones, newest first. Never past an
  /// authentication failure of the index (a wrong key, or a plain checkpoint where the
  /// config encrypts): that is returned at once.
  bool fall_back_to_previous = false;
  bool strict = true;                 ///< every tensor of the state must be in the checkpoint
  /// Stored tensors the state has no place for are refused unless this is set
  /// (LoadOptions::allow_unexpected).
  bool allow_unexpected = false;
  std::vector<std::string> only;      ///< load only these tensors (Caffe2's load_blobs)
  /// Which stored tensors are read and under which names: LoadOptions' fields of the same
  /// names (MindSpore's load_checkpoint arguments). Set here, they replace the config's
  /// (CheckpointConfig::load) for this call; choice_func and rename_func are called on
  /// every rank and must answer alike everywhere.
  std::vector<std::string> specify_prefix, filter_prefix;
  std::function<bool(const std::string& stored_name)> choice_func;
  std::map<std::string, std::string> rename;
  std::function<std::string(const std::string& stored_name)> rename_func;
  /// Checkpoints whose data nothing checks, as LoadOptions::allow_unchecked; unset: the
  /// config's (CheckpointConfig::load).
  std::optional<bool> allow_unchecked;
  /// Loads the chosen checkpoint instead of load(state): for a layer above the state dict
  /// that restores more than tensors (distckpt.torch). Called on every rank with the
  /// checkpoint's path and the LoadOptions resume would use; collective: it must return
  /// the same outcome on every rank. Not with a local tier (kUnsupported).
  std::function<Result<LoadResult>(const std::string& path, const LoadOptions& options)> load;
};

struct ResumeResult {
  bool resumed = false;  ///< false: nothing to resume from (a fresh start), not an error
  std::string path;
  int64_t step = -1, epoch = -1;
  std::map<std::string, InfoValue> info;
  std::vector<std::string> missing_in_checkpoint;     ///< in the state, not in the checkpoint
  std::vector<std::string> unexpected_in_checkpoint;  ///< in the checkpoint, not in the state
  std::vector<std::string> filtered_out;              ///< left out by the load's filters (LoadOptions)
  std::vector<std::string> skipped;                   ///< damaged checkpoints passed over
  /// With a local tier: where the bytes came from (tier.h).
  RestoreSources sources;
  /// CheckpointConfig::save_at_start on a fresh start: the initial checkpoint saved.
  std::string saved_at_start;
};

class CheckpointManager {
 public:
  /// Collective. Validates `config` on every rank, checks on rank 0 that the directory
  /// is writable (creating it), and chooses the series prefix: `prefix`, or
  /// `prefix_N` when committed checkpoints of another run already use it (resume()
  /// adopts the series it resumes from). Errors on every rank alike.
  /// With async_save, saves run on `async` when given (tests pass one over in-process
  /// communicators), else on one created with AsyncCheckpointer::create() from `comm`'s
  /// MPI communicator (kUnsupported on every rank without MPI_THREAD_MULTIPLE, or for a
  /// Comm without MPI). `async` without async_save is kInvalidArgument.
  /// `comm` and `state` are borrowed and must outlive the manager; `async` is owned by it.
  static Result<std::unique_ptr<CheckpointManager>> create(Comm& comm, StateDict& state, CheckpointConfig config,
                                                           std::unique_ptr<AsyncCheckpointer> async = nullptr);
  /// Local (no collective of its own): waits for a save still in flight, which the other
  /// ranks' background threads finish with this one. Its retention and statistics are
  /// then skipped and a failure of it is not reported: call end() first.
  ~CheckpointManager();

  /// Collective. Called after each training step: saves when the policy says so (or
  /// when a signal arrived), then applies retention on rank 0 after the commit and
  /// appends a line to <directory>/stats.jsonl (with async_save, when the background
  /// save completes; see CheckpointConfig::async_save). `metrics` is read on rank 0 only;
  /// a save made when it lacks best_metric (a periodic save between evaluations, a
  /// breakpoint on a signal) is made all the same and stays out of best-K.
  /// `step` is the number of completed steps (MMEngine's iter + 1); `epoch_end`: this
  /// step ends an epoch, and then `epoch` is the number of completed epochs (by_epoch
  /// counts these, MMEngine's epoch + 1). Nothing periodic is saved at 0. Saves made by a
  /// call with epoch_end carry the info value epoch_end = true.
  /// Errors (on every rank alike), for step_end, end and save_now: a failed save's error
  /// (kIoError, kAlreadyExists...) with on_failure kStop; with kContinue the failure is in
  /// StepOutcome::save_error and the call succeeds. kAborted after an exception save
  /// (run(), save_after_exception), naming the rank that threw.
  /// `epoch` defaults to 0, as in Python (a loop that counts steps only).
  Result<StepOutcome> step_end(int64_t step, int64_t epoch = 0, const std::map<std::string, double>& metrics = {},
                               bool epoch_end = false);
  /// Metrics in the order the caller reported them: save_best = {"auto"} takes the first
  /// one reported (MMEngine's rule; the std::map forms report them in name order).
  /// (Built explicitly, MetricsInOrder({{"loss", l}, {"acc", a}}), so that `{}` and
  /// `{{"loss", l}}` stay the std::map forms.)
  struct MetricsInOrder {
    explicit MetricsInOrder(std::vector<std::pair<std::string, double>> in_order) : values(std::move(in_order)) {}
    std::vector<std::pair<std::string, double>> values;
  };
  /// Collective. step_end, end and save_now with metrics in the caller's order; otherwise
  /// the same.
  Result<StepOutcome> step_end(int64_t step, int64_t epoch, const MetricsInOrder& metrics, bool epoch_end = false);
  Result<StepOutcome> end(int64_t step, int64_t epoch, const MetricsInOrder& metrics, bool epoch_end = false);
  Result<StepOutcome> save_now(int64_t step, int64_t epoch, const MetricsInOrder& metrics, const std::string& suffix = "");
  /// Collective. Completes a save in flight, then saves the final state (save_last)
  /// unless this step was just saved. `epoch_end`: the last step ended epoch `epoch` (the
  /// checkpoint is then the one ResumeOptions::epoch finds for it).
  Result<StepOutcome> end(int64_t step, int64_t epoch = 0, const std::map<std::string, double>& metrics = {},
                          bool epoch_end = false);
  /// Collective. Saves now, whatever the policy, as "<name><suffix>". With async_save
  /// the save runs in the background like a periodic one (in_flight): it is committed
  /// when a later call reports it in `committed` (end() always completes it).
  Result<StepOutcome> save_now(int64_t step, int64_t epoch = 0, const std::map<std::string, double>& metrics = {},
                               const std::string& suffix = "");

  /// Runs `loop` (the training loop, which calls step_end) and, with exception_save,
  /// turns an exception escaping it into a checkpoint before rethrowing it unchanged.
  /// What is saved: the state dict's buffers as they are when the exception arrives, under
  /// the step of the last step_end/end/save_now call of the failing rank, named
  /// "<name>_exception", with info values "exception" (its what()) and
  /// "exception_rank". This is the state after that step provided the step that
  /// followed had not started to modify the buffers (an exception from data loading,
  /// forward, backward or a loss check, not from the middle of an optimizer update);
  /// the manager cannot know more. It is saved only when every rank's state is at the
  /// same step (the others are in a manager call, step_end/end/save_now/publish/resume,
  /// for that step); otherwise, or when the others do not reach the manager within
  /// exception_save_timeout_s (they are blocked in a collective of the training step),
  /// nothing is saved and the reason is printed on stderr. After such a timeout the
  /// process must end with MPI_Abort (see CheckpointConfig::exception_save_timeout_s).
  /// In practice: an exception raised on every rank (a check they all make) is saved;
  /// one raised on a single rank is saved only if the others were already waiting in
  /// the manager at the same step. The checkpoint does not move `latest`: resume() never picks it
  /// by itself (ResumeOptions::target names it). The other ranks see the exception in
  /// StepOutcome (stop, exception_rank). Without exception_save, `loop` runs unwrapped.
  /// Thread: the loop's. last_exception_save() has the outcome on the failing rank.
  void run(const std::function<void()>& loop);
  /// What run() does in its catch block, for loops with their own: call it from the
  /// catch on the rank(s) that caught (`what`: the exception's description), then
  /// rethrow or abort. Returns the same outcome the other ranks get from step_end.
  Result<StepOutcome> save_after_exception(const std::string& what);
  /// As save_after_exception, but nothing is saved: for an error of this rank that
  /// leaves its state unusable (a tensor's memory it can no longer describe, say). The
  /// rank meets the others in their manager calls (exception_save_timeout_s), every rank
  /// gets stop with exception_rank and `what`, and the manager is finished. Returns
  /// kAborted when the others do not come in time.
  Result<StepOutcome> abort_after_error(const std::string& what);
  /// The outcome of the last exception save on this rank (kNotFound before any).
  Result<StepOutcome> last_exception_save() const;

  /// Collective. The best checkpoint of `metric`, one of save_best's ("" : the first;
  /// with "auto", the metric it became): its path on every rank. kNotFound when there is
  /// none yet; kInvalidArgument for a metric save_best does not name.
  Result<std::string> best_checkpoint(const std::string& metric = "");

  /// Collective. Publishes a committed checkpoint of the directory (a name or a path;
  /// "" : the newest) with publish_checkpoint() on rank 0, using publish_format and
  /// publish_only, and returns the file's path on every rank.
  Result<std::string> publish(const std::string& target = "");

  /// Collective. Finds, verifies and loads a checkpoint into the state (see ResumeOptions).
  /// A directory without committed checkpoints gives resumed = false. Errors: kNotFound
  /// for a named target that does not exist, kCorruption for a damaged one (unless
  /// fall_back_to_previous), kAuthFailed (config.encryption: a wrong key, or a plain
  /// checkpoint), load's errors.
  Result<ResumeResult> resume(const ResumeOptions& options = {});

  /// Local, any thread, once per process: SIGUSR1 and SIGTERM (what Slurm and mpirun
  /// send before killing a job) set a flag that the next step_end sees (on any rank)
  /// and turns into a breakpoint save on every rank. Async-signal-safe handler.
  /// kIoError naming the signal when sigaction fails.
  static Status install_signal_handlers();
  /// Local, any thread (an atomic flag); cannot fail: whether this process received one
  /// of those signals; clear_signal() forgets it (after the stop was handled, or in tests).
  static bool signal_received();
  static void clear_signal();

  /// Local, cannot fail: the series this manager names its saves in (create()'s choice,
  /// or the one resume() adopted). Owned by the manager.
  const std::string& series_prefix() const;
  /// The config in effect: name_template made from filename_tmpl, directory joined to
  /// out_dir.
  const CheckpointConfig& config() const;

 private:
  CheckpointManager();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distckpt
