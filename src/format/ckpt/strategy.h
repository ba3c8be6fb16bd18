// MindSpore's strategy file beside a per-rank .ckpt set: the layouts MindSpore's
// build_searched_strategy reads and merge_sliced_parameter / transform_checkpoints use to
// put the rank files' slices together (proto/mindspore_strategy.proto cites the schema).
#pragma once

#include <string>

#include "distckpt/status.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// The strategy file's name in a per-rank set's directory.
inline constexpr const char* kStrategyFileName = "strategy.ckpt";

// The serialized ParallelStrategyMap of `index`'s tensors, in index order: each tensor's
// device matrix and tensor map (the same semantics: tensor map entries count device axes
// from the right). kUnsupported, naming the first tensor, when a layout is one no
// strategy can express: explicit boxes, or a device matrix over other ranks than
// 0 .. world_size - 1 in order (MindSpore's rank in a stage is the row-major position).
// Pure; not collective.
Result<std::string> mindspore_strategy(const proto::Index& index);

}  // namespace distckpt::internal_format
