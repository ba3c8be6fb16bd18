// Which stored tensors a load sees, and under which names (LoadOptions: specify_prefix,
// filter_prefix, choice_func, rename, rename_func), as MindSpore 2.x's load_checkpoint
// and load_param_into_net users expect. Shared by load, load_all, the local tier's
// restore and convert (`distckpt convert --only/--exclude/--rename`), so that all select
// and rename alike.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/state_dict.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_plan {

struct LoadNames {
  // State-dict name -> index of the stored tensor it loads from.
  std::map<std::string, int> by_state_name;
  // Stored names the filters left out (not loaded, never "unexpected").
  std::vector<std::string> filtered_out;
  // Whether any filter or rename is set (messages say so when a tensor is missing).
  bool selective = false;
  // State names of stored scalars (0-d or [1]) that are also info values (a foreign .ckpt's
  // append info): loaded where the state has them, never "unexpected" where it has not.
  std::set<std::string> info_scalars;
};

// kInvalidArgument for a prefix list that overlaps the other (one prefix of a
// specify_prefix entry is a filter_prefix entry, or the reverse), an empty prefix, both
// rename and rename_func, a rename to an empty name, or a rename that gives two stored
// tensors the same name. Filters match stored names, before any rename; choice_func
// runs last, on the stored names the prefixes kept. Runs on each rank alone: the
// functions must answer alike on every rank (the load's agreement covers their errors).
Result<LoadNames> load_names(const proto::Index& index, const LoadOptions& options);

// Unless options.allow_unexpected: kMismatch naming (the first few of) the stored tensors
// that `names` maps to no tensor of `state` (torch's unexpected keys), with `where` (the
// checkpoint's path) in the message. A load with `only` loads a chosen subset (Caffe2's
// load_blobs): nothing is unexpected there. Local.
Status refuse_unexpected(const LoadNames& names, const StateDict& state, const LoadOptions& options,
                         const std::string& where);

}  // namespace distckpt::internal_plan
