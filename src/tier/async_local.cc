// AsyncCheckpointer::save_local_async: the local tier's phases (tier/local_save.h) on the
// asynchronous saver's staging and background thread (collective/async.cc).
#include "collective/staged_save.h"
#include "distckpt/async.h"
#include "tier/local_save.h"

namespace distckpt {

namespace {

class LocalJob : public internal_collective::StagedSave {
 public:
  explicit LocalJob(internal_tier::LocalSession session) : session_(std::move(session)) {}
  internal_collective::SaveSession& session() override { return session_.session; }
  Result<LocalSaveResult> finish(Comm& background, const Result<std::vector<uint32_t>>& crcs) override {
    return internal_tier::finish_local(background, session_, crcs);
  }

 private:
  internal_tier::LocalSession session_;
};

}  // namespace

Status AsyncCheckpointer::save_local_async(const StateDict& state, const std::string& root, const SaveOptions& options,
                                           const LocalTier& tier) {
  return start_staged(
      "save_local_async",
      [&](Comm& foreground) -> Result<std::unique_ptr<internal_collective::StagedSave>> {
        DISTCKPT_ASSIGN_OR_RETURN(internal_tier::LocalSession session,
                                  internal_tier::begin_local(foreground, state, root, options, tier));
        return std::unique_ptr<internal_collective::StagedSave>(new LocalJob(std::move(session)));
      },
      state);
}

}  // namespace distckpt
