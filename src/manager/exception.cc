// Saves on exception (CheckpointManager::run, save_after_exception): the failing rank
// meets the others in their next manager call (every call starts with the same
// allreduce, Impl::sync) and, when every rank's state is at the same step, all save.
#include <cstdio>

#include "manager/manager_impl.h"

namespace distckpt {

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
  if (!s.may_save) {  // abort_after_error on a failing rank: its state cannot be saved
    out.save_error = aborted(head + ": its state cannot be saved");
    return out;
  }
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
  kind.metric_allowed = false;
  kind.info["exception"] = InfoValue(message);
  kind.info["exception_rank"] = InfoValue(static_cast<int64_t>(s.failing_rank));
  const Status saved = save(s.min_step, epoch, {}, "_exception", kind, &out);
  if (!saved.ok()) out.save_error = saved;
  return out;
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
  return impl_->meet_after_exception(what, /*may_save=*/true);
}

Result<StepOutcome> CheckpointManager::abort_after_error(const std::string& what) {
  return impl_->meet_after_exception(what, /*may_save=*/false);
}

Result<StepOutcome> CheckpointManager::Impl::meet_after_exception(const std::string& what, bool may_save) {
  Impl& impl = *this;
  DISTCKPT_RETURN_IF_ERROR(impl.check_usable());
  // The failing rank says whether its state may be saved: the others follow (any "no" wins).
  const Impl::Sync sync = impl.sync(true, impl.cfg.exception_save_timeout_s, may_save);
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

}  // namespace distckpt
