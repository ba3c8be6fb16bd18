// Caffe2's metadata handler (CheckpointConfig::metadata_handler): rank 0 calls it, the
// others get its answers. Its failures never fail a save: they are warnings, as Caffe2's
// JobRunner logs them; only last_epoch's error fails the resume that asked.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "base/guard.h"
#include "comm/agree.h"
#include "manager/manager_impl.h"
#include "manager/stats.h"

namespace distckpt {

namespace {

// Runs a handler call on rank 0; an exception becomes a Status naming the method.
template <typename F>
Status handler_call(const std::string& where, const char* method, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return internal_error(where + ": metadata_handler." + method + " threw: " + e.what());
  } catch (...) {
    return internal_error(where + ": metadata_handler." + method + " threw");
  }
}

}  // namespace

void CheckpointManager::Impl::metadata_warning(const std::string& what) const {
  std::fprintf(stderr, "distckpt: %s\n", what.c_str());
  nlohmann::ordered_json j;
  j["event"] = "metadata_handler";
  j["warning"] = what;
  j["unix_ms"] = unix_ms_now();
  (void)internal_manager::append_stats_line(*fs, cfg.directory, j);
}

void CheckpointManager::Impl::metadata_set_params() {
  int64_t present = root() && cfg.metadata_handler ? 1 : 0;
  comm->broadcast(&present, sizeof(present), 0);  // the others ask rank 0's at each save
  has_metadata_handler = present != 0;
  metadata_params_changed();
}

void CheckpointManager::Impl::metadata_params_changed() {
  if (!root() || !cfg.metadata_handler) return;
  MetadataHandler::Params params;
  params.directory = cfg.directory;
  params.prefix = series;
  params.format = std::string(format_name(cfg.format));
  for (int r = 0; r < comm->size(); ++r) {  // each node once
    const std::string host = comm->node_name(r);
    if (std::find(params.hosts.begin(), params.hosts.end(), host) == params.hosts.end()) params.hosts.push_back(host);
  }
  Status st = handler_call(where(), "set_params", [&] {
    cfg.metadata_handler->set_params(params);
    return Status();
  });
  if (!st.ok()) metadata_warning(st.to_string());
}

bool CheckpointManager::Impl::metadata_accessible(StepOutcome* out) {
  int64_t accessible = 1;  // rank 0's handler decides (the others may have none)
  if (root() && cfg.metadata_handler) {
    Status st = handler_call(where(), "cp_accessible", [&] {
      accessible = cfg.metadata_handler->cp_accessible() ? 1 : 0;
      return Status();
    });
    if (!st.ok()) {
      accessible = 0;
      metadata_warning(st.to_string());
    }
  }
  comm->broadcast(&accessible, sizeof(accessible), 0);
  if (accessible != 0) return true;
  out->skipped = "the metadata handler's cp_accessible() said the checkpoint files cannot be accessed";
  if (root()) metadata_warning(where() + ": save skipped: " + out->skipped);
  return false;
}

void CheckpointManager::Impl::metadata_after_commit(const Record& record, const SaveResult& saved) const {
  if (!root() || !cfg.metadata_handler) return;
  if (record.epoch_end) {
    Status st = handler_call(where(), "write", [&] {
      return cfg.metadata_handler->write(record.epoch, record.step, saved.path);
    });
    if (!st.ok()) {  // as JobRunner's save_checkpoints: a warning, and no report
      metadata_warning(where() + ": metadata_handler.write for '" + saved.path + "': " + st.to_string());
      return;
    }
  }
  Status st = handler_call(where(), "report", [&] {
    cfg.metadata_handler->report("checkpoint_save", saved.path, saved.plan_s + saved.write_s + saved.commit_s);
    return Status();
  });
  if (!st.ok()) metadata_warning(st.to_string());
}

Result<std::optional<int64_t>> CheckpointManager::Impl::metadata_last_epoch(int64_t user_epoch) {
  // {has a value, the value}: rank 0's answer, or its error.
  int64_t answer[2] = {1, user_epoch};
  Status local;
  if (root()) {
    local = handler_call(where(), "last_epoch", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(std::optional<int64_t> e, cfg.metadata_handler->last_epoch(user_epoch));
      if (e && *e < -1) return invalid_argument("metadata_handler.last_epoch returned " + std::to_string(*e) +
                                                " (an epoch >= 0, -1 for the newest, or none)");
      answer[0] = e ? 1 : 0;
      answer[1] = e ? *e : -1;
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(*comm, local.with_context("resume")));
  comm->broadcast(answer, sizeof(answer), 0);
  if (answer[0] == 0) return std::optional<int64_t>();
  return std::optional<int64_t>(answer[1]);
}

void CheckpointManager::Impl::metadata_report_load(const ResumeResult& result, double seconds) const {
  if (!root() || !cfg.metadata_handler || !result.resumed) return;
  Status st = handler_call(where(), "report", [&] {
    cfg.metadata_handler->report("checkpoint_load", result.path, seconds);
    return Status();
  });
  if (!st.ok()) metadata_warning(st.to_string());
}

}  // namespace distckpt
