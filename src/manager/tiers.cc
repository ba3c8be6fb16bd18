// The manager's local tier (CheckpointConfig::local): local saves, their drains to the
// global root, retention per tier and resume from the fastest tier.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "base/guard.h"
#include "base/strings.h"
#include "catalog/claims.h"
#include "comm/agree.h"
#include "manager/manager_impl.h"
#include "manager/stats.h"
#include "storage/write_maps.h"
#include "tier/nodes.h"
#include "tier/record.h"

namespace distckpt {

using internal_base::join;
using internal_base::split;
using internal_comm::agree;

Status CheckpointManager::Impl::save_tiered(const StateDict& view, const SaveOptions& opts, Record record,
                                            const SaveKind& kind, internal_base::Timer& blocked, StepOutcome* out) {
  const bool final_save = !kind.may_run_async;  // breakpoint, end, exception: drained before returning
  if (final_save) {
    // The drain in flight first: the final one must not wait behind it in the background.
    DISTCKPT_RETURN_IF_ERROR(poll_drain(/*wait=*/true, out));
    pending_drain.clear();
  }
  record.tier = "local";
  if (async && !final_save) {
    // Returns once this rank's share is staged; written, protected and committed in the
    // background, completed by a later call (finish_in_flight).
    Status started = async->save_local_async(view, cfg.directory, opts, cfg.local);  // identical on every rank
    if (!started.ok()) return save_failed(started, out);
    record.blocking_s = blocked.seconds();
    record.in_background = true;
    in_flight = record;
    out->saved = true;
    out->in_flight = true;
    out->tier = "local";
    out->path = cfg.directory + "/" + opts.name;
    return Status();
  }
  auto saved = save_local(*comm, view, cfg.directory, opts, cfg.local);
  if (!saved.ok()) return save_failed(saved.status(), out);
  record.blocking_s = blocked.seconds();
  out->saved = true;
  out->path = cfg.directory + "/" + opts.name;
  return after_local_commit(*saved, record, final_save, out);
}

Status CheckpointManager::Impl::after_local_commit(const LocalSaveResult& saved, const Record& record, bool final_save,
                                                   StepOutcome* out) {
  ++local_saves;
  regular_this_run = true;
  out->tier = "local";
  out->committed.push_back(saved.save.path);
  last_saved_step = record.step;
  last_saved_epoch = record.epoch;
  last_saved_path = cfg.directory + "/" + record.name;

  // Local retention, then the statistics line of the local save.
  std::vector<std::string> warnings;
  if (!saved.save.warning.empty()) warnings.push_back(saved.save.warning);
  const std::vector<std::string> removed = retain_local(&warnings);
  for (const auto& name : removed) out->removed.push_back("local:" + name);
  if (root()) {
    nlohmann::ordered_json j;
    j["step"] = record.step;
    j["epoch"] = record.epoch;
    j["name"] = record.name;
    j["tier"] = "local";
    j["redundancy"] = cfg.local.redundancy;
    j["async"] = record.in_background;
    j["bytes_local"] = saved.save.bytes_written;
    j["redundancy_bytes"] = saved.redundancy_bytes;
    j["storage_ratio"] = saved.storage_ratio;
    j["node_bytes_max"] = saved.node_bytes_max;
    j["blocking_s"] = record.blocking_s;
    j["plan_s"] = saved.save.plan_s;
    j["write_s"] = saved.save.write_s;
    j["redundancy_s"] = saved.redundancy_s;
    j["commit_s"] = saved.save.commit_s;
    j["removed"] = removed;
    j["warnings"] = warnings;
    j["unix_ms"] = internal_manager::unix_ms_now();
    if (Status st = internal_manager::append_stats_line(*fs, cfg.directory, j); !st.ok())
      std::fprintf(stderr, "distckpt: %s: stats: %s\n", where().c_str(), st.to_string().c_str());
  }

  Record to_drain = record;
  to_drain.tier = "drain";
  if (final_save) {
    Status drained = start_drain(to_drain, out);
    if (drained.ok()) drained = poll_drain(/*wait=*/true, out);
    if (!drained.ok()) {
      out->drain_error = drained.with_context("drain of '" + record.name + "' (the local copy stays)");
      if (root()) std::fprintf(stderr, "distckpt: %s\n", out->drain_error.to_string().c_str());
    }
    return Status();
  }
  if (cfg.global_every > 0 && local_saves % cfg.global_every == 0) {
    if (drain) {
      pending_drain = record.name;  // after the one in flight; only the newest waits
      pending_record = to_drain;
    } else {
      Status started = start_drain(to_drain, out);
      if (!started.ok()) {
        out->drain_error = started.with_context("drain of '" + record.name + "' (the local copy stays)");
        if (root()) std::fprintf(stderr, "distckpt: %s\n", out->drain_error.to_string().c_str());
      }
    }
  }
  return Status();
}

Status CheckpointManager::Impl::start_drain(const Record& record, StepOutcome* out) {
  (void)out;
  SaveOptions opts;
  static_cast<SaveSettings&>(opts) = cfg;
  opts.fs = fs;
  opts.update_latest = true;
  DISTCKPT_ASSIGN_OR_RETURN(drain, internal_tier::DrainJob::start(*comm, cfg.directory, cfg.local, record.name, opts));
  drain_record = record;
  return Status();
}

Status CheckpointManager::Impl::poll_drain(bool wait, StepOutcome* out) {
  while (drain) {
    DrainResult result;
    Status failed;
    if (wait) {
      auto r = drain->wait(*comm);
      if (r.ok()) result = *r;
      else failed = r.status();
    } else {
      auto r = drain->poll(*comm, &result);
      if (!r.ok()) failed = r.status();
      else if (!*r) return Status();  // still copying
    }
    const Record record = drain_record;
    drain.reset();
    if (!failed.ok()) {
      out->drain_error = failed.with_context("drain of '" + record.name + "' (the local copy stays)");
      if (root()) std::fprintf(stderr, "distckpt: %s\n", out->drain_error.to_string().c_str());
    } else {
      Record done = record;
      done.drain_s = result.drain_s;
      out->drained.push_back(result.save.path);
      // The statistics line and the global tier's retention, as for a global save.
      StepOutcome global;
      DISTCKPT_RETURN_IF_ERROR(after_commit(result.save, done, /*apply_retention=*/true, &global));
      for (auto& r : global.removed) out->removed.push_back(r);
      // A local checkpoint kept only because it was being drained may go now.
      std::vector<std::string> warnings;
      for (const auto& name : retain_local(&warnings)) out->removed.push_back("local:" + name);
      if (root())
        for (const auto& w : warnings) std::fprintf(stderr, "distckpt: %s: %s\n", where().c_str(), w.c_str());
    }
    if (!pending_drain.empty()) {
      const Record next = pending_record;
      pending_drain.clear();
      Status started = start_drain(next, out);
      if (!started.ok()) {
        out->drain_error = started.with_context("drain of '" + next.name + "' (the local copy stays)");
        if (root()) std::fprintf(stderr, "distckpt: %s\n", out->drain_error.to_string().c_str());
      }
      if (!wait) return Status();
    }
  }
  return Status();
}

std::vector<std::string> CheckpointManager::Impl::retain_local(std::vector<std::string>* warnings) {
  // Rank 0 decides from the records: this series' newest keep_local stay, and any being
  // drained or waiting to be. The live set (whose files stay on the nodes) is every entry
  // of the records directory, parsed or not: a record this reader cannot parse (damaged,
  // or from a newer version) must not get its checkpoint's files removed. When the
  // directory cannot be listed, no node removes anything.
  std::string removed_joined, live_joined, listed = "0";
  if (root()) {
    auto records = list_local_records(cfg.directory, fs);
    const std::string records_dir = internal_tier::records_dir(cfg.directory);
    auto entries = fs->exists(records_dir) ? fs->list_dir(records_dir) : Result<std::vector<DirEntry>>(std::vector<DirEntry>{});
    if (!records.ok() || !entries.ok()) {
      warnings->push_back("local retention: " + (records.ok() ? entries.status() : records.status()).to_string());
    } else {
      listed = "1";
      int kept = 0;
      std::vector<std::string> removed;
      std::set<std::string> live;
      for (const DirEntry& e : *entries)
        if (!e.is_dir) live.insert(e.name);
      for (const auto& r : *records) {  // newest first
        if (!names.matches(series, r.name)) continue;
        const bool busy = (drain && r.name == drain->name()) || r.name == pending_drain;
        if (kept < cfg.keep_local || busy) {
          ++kept;
          continue;
        }
        // The record goes first: from then on the checkpoint is not listed at this tier.
        Status st = fs->remove_file(internal_tier::record_path(cfg.directory, r.name));
        if (st.ok()) {
          removed.push_back(r.name);
          live.erase(r.name);
        } else {
          warnings->push_back("local retention: " + st.to_string());
        }
      }
      removed_joined = join(removed, '\n');
      live_joined = join(std::vector<std::string>(live.begin(), live.end()), '\n');
    }
  }
  comm->broadcast_string(listed, 0);
  comm->broadcast_string(removed_joined, 0);
  comm->broadcast_string(live_joined, 0);
  if (listed != "1") return split(removed_joined, '\n');
  // Every node's leader removes the files of checkpoints no record lists (retired now,
  // or left by a save that failed before its record was committed) of this series. A
  // local save running in the background has no record yet: its directories stay.
  const std::string writing = in_flight && in_flight->tier == "local" ? in_flight->name : "";
  const internal_tier::NodeMap nodes = internal_tier::node_map(*comm);
  if (nodes.leader(nodes.node_of[static_cast<std::size_t>(comm->rank())]) == comm->rank()) {
    const std::string dir = internal_tier::node_dir(*comm, cfg.local.dir, comm->rank());
    const std::vector<std::string> live = split(live_joined, '\n');
    const std::set<std::string> keep(live.begin(), live.end());
    auto entries = fs->list_dir(dir);
    if (entries.ok())
      for (const DirEntry& e : *entries) {
        if (!e.is_dir) continue;
        std::string name = e.name;
        if (auto at = name.find(".tmp-"); at != std::string::npos) {
          // Left by a save of this series that failed or was killed: saves are collective,
          // so none of this job's is being written here, except the background one.
          name = name.substr(0, at);
        } else if (keep.count(name)) {
          continue;
        }
        if (name == writing || !names.matches(series, name)) continue;
        (void)internal_tier::remove_node_entry(*fs, dir, e.name, cfg.local.recycle);
      }
  }
  internal_storage::prune_write_mappings();  // this rank's mappings of removed files
  return split(removed_joined, '\n');
}

void CheckpointManager::Impl::drop_spares() { release_local_spares(*comm, cfg.local, fs); }

Result<ResumeResult> CheckpointManager::Impl::resume_tiered(const ResumeOptions& options) {
  RestoreOptions ro;
  ro.load = cfg.load;
  ro.load.fs = fs;
  ro.load.key = cfg.encryption.key;
  ro.load.strict = options.strict;
  ro.load.allow_unexpected = options.allow_unexpected;
  if (options.load) return unsupported(where() + ": resume: a custom load (distckpt.torch's state) is not supported with a local tier");
  if (!options.only.empty() || !options.specify_prefix.empty() || !options.filter_prefix.empty() ||
      options.choice_func || !options.rename.empty() || options.rename_func)
    return invalid_argument(where() + ": resume: `only`, the prefixes, choice_func and renames are not supported "
                            "with a local tier");
  if (options.allow_unchecked) ro.load.allow_unchecked = options.allow_unchecked;
  if (options.step >= 0 || options.epoch >= 0)
    return invalid_argument(where() + ": resume: `step` and `epoch` are not supported with a local tier");
  ro.name = options.target;
  if (ro.name.find('/') != std::string::npos) ro.name = internal_base::base_name(ro.name);
  ro.fall_back = options.target.empty() || options.fall_back_to_previous;
  // A job with an identity (a requeued Slurm job) resumes its own series when that has
  // checkpoints: another job in the same root may have saved later ones.
  if (options.target.empty() && !job_id.empty())
    ro.prefer = [this](const std::string& name) { return names.matches(series, name); };
  ResumeResult result;
  auto restored = restore(*comm, *state, cfg.directory, cfg.local, ro);
  if (!restored.ok()) {
    // Nothing anywhere: a fresh start.
    if (restored.status().code() == StatusCode::kNotFound && options.target.empty() &&
        restored.status().message().find("no checkpoint in any tier") != std::string::npos)
      return result;
    return restored.status().with_context("resume");
  }
  result.resumed = true;
  result.path = cfg.directory + "/" + restored->name;
  result.step = restored->load.step;
  result.epoch = restored->load.epoch;
  result.info = restored->load.info;
  result.missing_in_checkpoint = restored->load.missing_in_checkpoint;
  result.unexpected_in_checkpoint = restored->load.unexpected_in_checkpoint;
  result.filtered_out = restored->load.filtered_out;
  result.skipped = restored->skipped;
  result.sources = restored->sources;
  last_saved_step = result.step;
  current_step = result.step;
  current_epoch = result.epoch;
  // Continue the series resumed from.
  std::string resumed_series = series;
  if (root()) {
    if (auto prefix = names.prefix_of(cfg.prefix, restored->name)) resumed_series = *prefix;
    if (resumed_series != series) {
      (void)internal_catalog::adopt_series(*fs, cfg.directory, resumed_series, job_id);
      internal_catalog::release_series(*fs, cfg.directory, series);
    }
    nlohmann::ordered_json j;
    j["event"] = "resume";
    j["name"] = restored->name;
    j["step"] = result.step;
    j["restore_s"] = restored->load.load_s;
    j["rebuild_s"] = restored->rebuild_s;
    j["bytes_read"] = restored->load.bytes_read;
    j["sources"] = {{"local", restored->sources.local},
                    {"peer", restored->sources.peer},
                    {"parity", restored->sources.parity},
                    {"global", restored->sources.global},
                    {"parity_read", restored->sources.parity_read},
                    {"storage_read", restored->sources.storage_read},
                    {"lost_chunks", restored->sources.lost_chunks}};
    internal_manager::add_resume_lists(j, result);
    j["unix_ms"] = internal_manager::unix_ms_now();
    (void)internal_manager::append_stats_line(*fs, cfg.directory, j);
  }
  comm->broadcast_string(resumed_series, 0);
  series = resumed_series;
  return result;
}

}  // namespace distckpt
