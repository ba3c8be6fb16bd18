// CheckpointManager::publish and what end() publishes: single shareable files of the
// series' final and best checkpoints, written on rank 0.
#include <algorithm>

#include "base/guard.h"
#include "base/strings.h"
#include "comm/agree.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "manager/best.h"
#include "manager/manager_impl.h"

namespace distckpt {

using internal_base::join;
using internal_base::split;
using internal_comm::agree;

std::string CheckpointManager::Impl::best_checkpoint() const {
  if (cfg.best_metric.empty()) return "";
  auto listing = list_checkpoints(cfg.directory, {.fs = fs});
  if (!listing.ok()) return "";
  const auto ranked = internal_manager::best_by_metric(series_with_metrics(*listing), rule);
  return ranked.empty() ? "" : cfg.directory + "/" + ranked.front();
}

Result<std::vector<std::string>> CheckpointManager::Impl::publish_on_root(const std::vector<std::string>& sources) {
  std::string paths;
  Status local;
  if (root()) {
    local = internal_base::guarded(where(), [&]() -> Status {
      for (const auto& src : sources) {
        PublishOptions options;
        options.format = cfg.publish_format;
        options.only = cfg.publish_only;
        options.fs = fs;
        options.key = cfg.encryption.key;
        DISTCKPT_ASSIGN_OR_RETURN(PublishResult published, publish_checkpoint(src, options));
        paths += (paths.empty() ? "" : "\n") + published.path;
        upload_after_commit(published.path, /*at_end=*/true);  // (publishing ends a run or is asked for)
      }
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*comm, local));
  comm->broadcast_string(paths, 0);
  return split(paths, '\n');
}

Result<std::string> CheckpointManager::publish(const std::string& target) {
  Impl& impl = *impl_;
  DISTCKPT_RETURN_IF_ERROR(impl.enter_plain("publish"));
  DISTCKPT_RETURN_IF_ERROR(impl.complete_async_quietly("publish"));
  std::string source;
  Status local;
  if (impl.root()) {
    const std::string& dir = impl.cfg.directory;
    auto resolved = target.empty() ? resolve_checkpoint(dir, {.fs = impl.fs})
                                   : Result<std::string>(target.find('/') != std::string::npos ? target : dir + "/" + target);
    if (resolved.ok()) source = *resolved;
    else local = resolved.status();
  }
  DISTCKPT_RETURN_IF_ERROR(agree(*impl.comm, local.with_context(impl.where() + ": publish")));
  DISTCKPT_ASSIGN_OR_RETURN(std::vector<std::string> paths, impl.publish_on_root({source}));
  return paths.empty() ? std::string() : paths.front();
}

}  // namespace distckpt
