// The public description of a checkpoint (CheckpointInfo) from its index.
#pragma once

#include <string>

#include "distckpt/inspect.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_tools {

// Everything `distckpt inspect` shows: every rank a layout names is listed, so callers
// bound the index first (validate_index bounds the listed ranks).
CheckpointInfo to_checkpoint_info(const proto::Index& index, const std::string& path);

}  // namespace distckpt::internal_tools
