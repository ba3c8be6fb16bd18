// Matching a state dict to a stored checkpoint, the same for every way in: load() (and
// load_all, which loads through it) and the local tier's restore. Names go through the
// load's filters and renames (load_names.h); each matched tensor's dtype must equal the
// stored one, or be a floating dtype that LoadOptions::cast_floats converts; its global
// shape must equal the stored one, or (where allowed) differ only by trailing dims of
// size 1, as MindSpore accepts; its buffers must be writable (layout/strided.h).
// Metadata only: no data is read.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/state_dict.h"
#include "distckpt_index.pb.h"
#include "plan/load_names.h"

namespace distckpt::internal_plan {

struct MatchedTensor {
  int state = 0;   // in state.tensors()
  int stored = 0;  // in index.tensors()
  // Set when the tensor's boxes are read into packed staging buffers in this dtype and
  // written back after (load_staging.h): the stored dtype for a cast, or the tensor's own
  // for strided buffers.
  std::optional<DType> staged_dtype;
  // The dtype its bytes are read in: staged_dtype, else the tensor's own.
  DType read_dtype = DType::kFloat32;
};

struct Matching {
  LoadNames names;
  std::vector<MatchedTensor> matched;  // in the order of `wanted`
  std::vector<std::string> missing_in_checkpoint;     // state names (strict = false only)
  std::vector<std::string> unexpected_in_checkpoint;  // stored names
};

struct MatchRules {
  // The checkpoint as messages name it.
  std::string checkpoint;
  // Accept a stored shape with extra (or fewer) trailing dims of size 1, rewriting the
  // stored tensor's shape and chunk boxes in `index` to the state's shape.
  bool reshape_trailing_ones = true;
  // Compare dtypes (LoadOptions::cast_floats decides casts). Off where the copy into the
  // state converts any dtype itself (Python's Reader.load_into: torch's copy_).
  bool check_dtypes = true;
  // Called for each tensor as soon as it matched, before the next is looked at (a load
  // checks its chunks' files there): its error is match_state's. May be null.
  std::function<Status(const MatchedTensor&)> on_match;
};

// The state tensors a load asks for: options.only's, in its order, or all. Local;
// kInvalidArgument naming a tensor of `only` the state does not have.
Result<std::vector<int>> wanted_tensors(const StateDict& state, const LoadOptions& options);

// Matches the tensors of `state` the load asks for (wanted_tensors) to `index`, in that
// order. kMismatch (naming the tensor and the checkpoint) for a tensor missing under
// options.strict, a dtype or shape that differs, or stored tensors left unexpected
// (refuse_unexpected); kInvalidArgument for bad filters, an unknown `only` name or
// unwritable buffers; kCorruption for chunks that cannot be reshaped; on_match's errors.
// Stored scalars that are info values are never unexpected. Local: runs on each rank
// alone (callers agree on the outcome); mutates `index` only to reshape trailing ones.
Result<Matching> match_state(const StateDict& state, proto::Index& index, const LoadOptions& options,
                             const MatchRules& rules);

}  // namespace distckpt::internal_plan
