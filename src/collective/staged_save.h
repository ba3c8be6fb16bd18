// A save whose data file the asynchronous saver stages and whose remaining phases run on
// its background communicator (the local tier's save: tier/async_local.cc).
#pragma once

#include <vector>

#include "collective/save_session.h"
#include "distckpt/local_tier.h"

namespace distckpt::internal_collective {

class StagedSave {
 public:
  virtual ~StagedSave() = default;
  // The session to stage: its chunks, data file and frame.
  virtual SaveSession& session() = 0;
  // Collective on `background`: the rest of the save, given this rank's write outcome.
  virtual Result<LocalSaveResult> finish(Comm& background, const Result<std::vector<uint32_t>>& crcs) = 0;
};

}  // namespace distckpt::internal_collective
