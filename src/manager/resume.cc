// CheckpointManager::resume: candidates newest first (the catalog's one ordering),
// verified, loaded; the series resumed from is adopted.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <variant>

#include "base/guard.h"
#include "base/strings.h"
#include "base/timer.h"
#include "catalog/claims.h"
#include "catalog/listing.h"
#include "comm/agree.h"
#include "manager/manager_impl.h"
#include "manager/stats.h"

namespace distckpt {

using internal_base::split;
using internal_comm::agree;

std::vector<std::string> CheckpointManager::Impl::newer_in_series(const std::string& resumed) const {
  auto listing = list_checkpoints(cfg.directory, {.fs = fs});
  if (!listing.ok()) return {};
  const CheckpointEntry* from = nullptr;
  for (const auto& e : listing->entries)
    if (e.name == resumed) from = &e;
  std::vector<std::string> newer;
  if (from == nullptr) return newer;
  // The branch: periodic and final saves (those that move `latest`), not exception saves
  // or side snapshots, which are loaded only when named.
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted && e.advances_latest && e.commit_seq > from->commit_seq &&
        names.matches(series, e.name))
      newer.push_back(e.name);
  return newer;
}

Result<ResumeResult> CheckpointManager::resume(const ResumeOptions& options) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.enter_plain("resume"));
  DISTCKPT_RETURN_IF_ERROR(impl.complete_async_quietly("resume"));
  // The options are the same on every rank (a collective call's arguments): so is this.
  if (options.epoch >= 0 && (options.step >= 0 || !options.target.empty()))
    return invalid_argument(impl.where() + ": resume: `epoch` cannot be combined with `step` or `target`");
  // Caffe2's get_resume_from_epoch_id: the metadata handler chooses the epoch (none: a
  // fresh start) unless the call names a checkpoint or a step.
  ResumeOptions chosen = options;
  bool fresh = false;  // the handler knows no checkpoint
  if (impl.has_metadata_handler && options.target.empty() && options.step < 0) {
    DISTCKPT_ASSIGN_OR_RETURN(std::optional<int64_t> epoch, impl.metadata_last_epoch(options.epoch));
    fresh = !epoch;
    chosen.epoch = epoch.value_or(-1);
  }
  ResumeResult result;
  if (!fresh) {
    internal_base::Timer resuming;
    Result<ResumeResult> resumed = impl.tiered() ? impl.resume_tiered(chosen) : impl.resume_global(chosen);
    if (!resumed.ok()) return resumed.status();
    result = std::move(*resumed);
    impl.metadata_report_load(result, resuming.seconds());
  }
  const bool implicit = options.target.empty() && options.step < 0 && (options.epoch < 0 || fresh);
  if (result.resumed || !impl.cfg.save_at_start || !implicit) return result;
  // A fresh start: Caffe2 checkpoints epoch 0 before training.
  impl.current_step = 0;
  impl.current_epoch = 0;
  impl.current_epoch_end = true;
  StepOutcome out;
  DISTCKPT_RETURN_IF_ERROR(impl.save(0, 0, {}, "", Impl::SaveKind(), &out));
  if (!out.save_error.ok() && impl.root())  // OnSaveFailure::kContinue: reported, training goes on
    std::fprintf(stderr, "distckpt: %s: save_at_start: %s\n", impl.where().c_str(), out.save_error.to_string().c_str());
  if (out.saved) result.saved_at_start = out.path;
  return result;
}

// What resume may load, best first: the target (or the newest), then older committed
// ones; or a fresh start.
struct CheckpointManager::Impl::ResumeCandidates {
  bool fresh_start = false;
  std::vector<std::string> paths;
  std::string skipped;  // the damaged checkpoint `latest` names, passed over first
};

// Rank 0: the candidates by the call's rule (target, step, epoch, the job's own
// series, or the newest). kNotFound when what was asked for is not there.
Result<CheckpointManager::Impl::ResumeCandidates> CheckpointManager::Impl::resume_candidates(
    const ResumeOptions& options) {
  Impl& impl = *this;
  const std::string& dir = impl.cfg.directory;
  ResumeCandidates out;
  ResumeCandidates fresh_start;
  fresh_start.fresh_start = true;
  // Candidates, best first: the target (or the newest), then older committed ones.
  DISTCKPT_ASSIGN_OR_RETURN(RootListing listing, list_checkpoints(dir, {.fs = impl.fs}));
  // Implicit candidates (no target): the saves that move `latest` (not conversions or
  // published files) when there are any, as resolve_checkpoint does, and never an
  // exception save (a best-effort state: loaded only when named).
  const bool implicit = options.target.empty() && options.step < 0 && options.epoch < 0;
  // ResumeOptions::epoch: saved by a call that ended that epoch (info epoch_end).
  InspectOptions inspect{.fs = impl.fs, .key = impl.cfg.encryption.key};
  auto ends_epoch = [&](const CheckpointEntry& e) {
    auto info = read_checkpoint_info(dir + "/" + e.name, inspect);
    if (!info.ok()) return false;
    auto it = info->info.find("epoch_end");
    return it != info->info.end() && std::holds_alternative<bool>(it->second) && std::get<bool>(it->second);
  };
  auto wanted = [&](const CheckpointEntry& e) {
    if (options.step >= 0 && e.step != options.step) return false;
    if (options.epoch >= 0 && (e.epoch != options.epoch || !ends_epoch(e))) return false;
    return true;
  };
  static const std::regex exception_suffix("_exception(_[0-9]+)?(\\.[a-z0-9]+)?$");
  auto exception_save = [](const std::string& name) { return std::regex_search(name, exception_suffix); };
  // The checkpoints the call's rule allows (all, or those of `step` / `epoch`).
  std::vector<CheckpointEntry> allowed;
  for (const auto& e : listing.entries)
    if (e.state == EntryState::kCommitted && wanted(e)) allowed.push_back(e);
  // Chosen by rule (no target): only saves that move `latest` when there are any
  // (never a best copy or a conversion), never an exception save.
  const bool by_rule = options.target.empty();
  bool any_advancing = false;
  for (const auto& e : allowed) any_advancing |= e.advances_latest;
  // A job with an identity (a requeued Slurm job) resumes its own series when that
  // has checkpoints (of the step or epoch asked for): another job in the same root
  // may have saved later ones.
  bool own_series = false;
  if (by_rule && !impl.job_id.empty()) {
    if (implicit) own_series = !impl.names.entries(impl.series, listing).empty();
    else
      for (const auto& e : allowed) own_series |= impl.names.matches(impl.series, e.name) && !exception_save(e.name);
  }
  std::vector<CheckpointEntry> committed;
  for (const auto& e : allowed)
    if ((!by_rule || ((!any_advancing || e.advances_latest) && !exception_save(e.name))) &&
        (!own_series || impl.names.matches(impl.series, e.name)))
      committed.push_back(e);
  // Asked for by step or epoch, and only an exception save or a best copy has it:
  // that is what was asked for.
  if (committed.empty() && by_rule && !implicit) committed = allowed;
  std::sort(committed.begin(), committed.end(), [&](const CheckpointEntry& a, const CheckpointEntry& b) {
    return internal_catalog::newer(a, b, listing.latest);
  });
  if (!options.target.empty()) {
    const std::string path = options.target.find('/') != std::string::npos ? options.target : dir + "/" + options.target;
    if (!impl.fs->exists(path)) return not_found("resume: '" + path + "' does not exist");
    out.paths.push_back(path);
  } else if (options.step >= 0) {
    if (committed.empty()) return not_found("resume: no committed checkpoint of step " + std::to_string(options.step) + " under '" + dir + "'");
  } else if (options.epoch >= 0) {
    if (committed.empty()) {
      std::set<int64_t> present;
      for (const auto& e : listing.entries)
        if (e.state == EntryState::kCommitted && e.epoch >= 0 && ends_epoch(e)) present.insert(e.epoch);
      std::string epochs;
      for (int64_t p : present) epochs += (epochs.empty() ? "" : ", ") + std::to_string(p);
      return not_found("resume: no committed checkpoint saved at the end of epoch " + std::to_string(options.epoch) +
                       " under '" + dir + "' (epochs with one: " + (epochs.empty() ? "none" : epochs) + ")");
    }
  } else if (own_series) {
    if (committed.empty()) return fresh_start;  // only exception saves
  } else {
    auto newest = resolve_checkpoint(dir, {.fs = impl.fs});
    if (newest.ok() && !exception_save(*newest)) out.paths.push_back(*newest);
    else if (newest.ok() && committed.empty()) return fresh_start;  // only exception saves
    else if (!newest.ok() && newest.status().code() == StatusCode::kNotFound) return fresh_start;
    else if (!newest.ok() && !options.fall_back_to_previous)
      return Status(newest.status().code(), "resume: " + newest.status().message() +
                                                (newest.status().code() == StatusCode::kCorruption
                                                     ? " (or set fall_back_to_previous to use an older one)"
                                                     : ""));
    // Falling back: the damaged checkpoint `latest` names is the first passed over.
    else if (!newest.ok() && newest.status().code() == StatusCode::kCorruption) {
      const std::string pointer = internal_catalog::read_latest_pointer(*impl.fs, dir);
      for (const auto& e : listing.entries)
        if (e.state == EntryState::kBroken && e.name == pointer) out.skipped = dir + "/" + e.name;
    }
  }
  for (const auto& e : committed) {
    const std::string path = dir + "/" + e.name;
    if (std::find(out.paths.begin(), out.paths.end(), path) == out.paths.end()) out.paths.push_back(path);
  }
  return out;
}

// Rank 0: the first candidate that verifies (or whose index reads, without
// options.verify), falling back to older ones only with fall_back_to_previous; skipped
// ones are listed in `skipped`. kNotFound when none is good.
Status CheckpointManager::Impl::choose_candidate(const ResumeOptions& options, const ResumeCandidates& found,
                                                std::string* chosen, std::string* skipped, double* verify_s) {
  Impl& impl = *this;
  const std::string& dir = impl.cfg.directory;
  const std::vector<std::string>& candidates = found.paths;
  *skipped = found.skipped;
  internal_base::Timer verifying;
  struct AddTime {  // every way out of the loop counts its time
    internal_base::Timer& t;
    double& into;
    ~AddTime() { into = t.seconds(); }
  } add_time{verifying, *verify_s};
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i > 0 && !options.fall_back_to_previous) break;
    VerifyOptions verify;
    verify.fs = impl.fs;
    verify.key = impl.cfg.encryption.key;
    verify.allow_unchecked = options.allow_unchecked ? options.allow_unchecked : impl.cfg.load.allow_unchecked;
    Status ok = options.verify ? verify_checkpoint(candidates[i], verify).status()
                               : read_checkpoint_info(candidates[i], verify).status();
    if (ok.ok()) {
      *chosen = candidates[i];
      return Status();
    }
    // A wrong key, or a checkpoint not encrypted as configured, is no damage to fall
    // back from: an older checkpoint would fail alike, or be the downgrade itself. Those
    // fail on the index (no chunk read); a chunk failing authentication is damage.
    if (ok.code() == StatusCode::kAuthFailed) {
      Status index_level = read_checkpoint_info(candidates[i], verify).status();
      if (index_level.code() == StatusCode::kAuthFailed)
        return index_level.with_context("resume: '" + candidates[i] + "'");
    }
    // Data that records no checksums is not damage: allow_unchecked decides (kUnsupported).
    if (ok.code() == StatusCode::kUnsupported) return ok.with_context("resume: '" + candidates[i] + "'");
    if (!options.fall_back_to_previous)
      return ok.with_context("resume: '" + candidates[i] + "' is damaged (set fall_back_to_previous to use an older one)");
    *skipped += (skipped->empty() ? "" : "\n") + candidates[i];
  }
  return not_found("resume: no undamaged committed checkpoint under '" + dir + "'");
}

Result<ResumeResult> CheckpointManager::Impl::resume_global(const ResumeOptions& options) {
  Impl& impl = *this;
  const std::string& dir = impl.cfg.directory;
  ResumeResult result;
  std::string chosen, skipped;
  double verify_s = 0;  // rank 0: checking the candidates
  Status local;
  if (impl.root()) {
    local = internal_base::guarded(impl.where(), [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(const ResumeCandidates found, resume_candidates(options));
      if (found.fresh_start) return Status();
      return choose_candidate(options, found, &chosen, &skipped, &verify_s);
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*impl.comm, local));
  impl.comm->broadcast_string(chosen, 0);
  impl.comm->broadcast_string(skipped, 0);
  result.skipped = split(skipped, '\n');
  if (chosen.empty()) return result;

  LoadOptions lo = impl.cfg.load;  // how resume reads; what and from where is this call's
  lo.strict = options.strict;
  lo.allow_unexpected = options.allow_unexpected;
  lo.only = options.only;
  if (!options.specify_prefix.empty()) lo.specify_prefix = options.specify_prefix;
  if (!options.filter_prefix.empty()) lo.filter_prefix = options.filter_prefix;
  if (options.choice_func) lo.choice_func = options.choice_func;
  if (!options.rename.empty() || options.rename_func) {  // the call's renaming, whole
    lo.rename = options.rename;
    lo.rename_func = options.rename_func;
  }
  if (options.allow_unchecked) lo.allow_unchecked = options.allow_unchecked;
  lo.fs = impl.fs;
  lo.key = impl.cfg.encryption.key;
  DISTCKPT_ASSIGN_OR_RETURN(LoadResult loaded,
                            options.load ? options.load(chosen, lo) : load(*impl.comm, *impl.state, chosen, lo));
  result.resumed = true;
  result.path = chosen;
  result.step = loaded.step;
  result.epoch = loaded.epoch;
  result.info = std::move(loaded.info);
  result.missing_in_checkpoint = std::move(loaded.missing_in_checkpoint);
  result.unexpected_in_checkpoint = std::move(loaded.unexpected_in_checkpoint);
  result.filtered_out = std::move(loaded.filtered_out);
  if (impl.root()) {
    // What was loaded and what was not, for whoever reads the run's statistics.
    nlohmann::ordered_json j;
    j["event"] = "resume";
    j["name"] = internal_base::base_name(chosen);
    j["step"] = result.step;
    j["source"] = chosen;
    j["tier"] = "global";
    j["verified"] = options.verify;
    j["verify_s"] = verify_s;
    j["restore_s"] = loaded.load_s;
    j["bytes_read"] = loaded.bytes_read;
    internal_manager::add_resume_lists(j, result);
    j["unix_ms"] = internal_manager::unix_ms_now();
    (void)internal_manager::append_stats_line(*impl.fs, dir, j);
  }
  impl.last_saved_step = result.step;
  impl.current_step = result.step;
  impl.current_epoch = result.epoch;
  // Continue the series we resumed from (prefix or prefix_N), so retention sees it.
  std::string series = impl.series;
  if (impl.root()) {
    if (auto prefix = impl.names.prefix_of(impl.cfg.prefix, internal_base::base_name(chosen))) series = *prefix;
    if (series != impl.series) {
      // The series resumed is this job's from now on; the prefix claimed at creation goes back.
      (void)internal_catalog::adopt_series(*impl.fs, dir, series, impl.job_id);
      internal_catalog::release_series(*impl.fs, dir, impl.series);
    }
  }
  impl.comm->broadcast_string(series, 0);
  if (series != impl.series) impl.forget_bests();
  const bool adopted = series != impl.series;
  impl.series = series;
  if (adopted) impl.metadata_params_changed();  // the handler learns the series it now writes
  if (impl.root()) {
    impl.abandoned = impl.newer_in_series(internal_base::base_name(chosen));
    // A rewind's next incremental save builds on the checkpoint resumed, not on the
    // abandoned branch's newest (which goes once that save is committed).
    if (!impl.abandoned.empty()) impl.last_saved_path = chosen;
  }
  return result;
}

}  // namespace distckpt
