#include "plan/match.h"

#include <algorithm>
#include <set>

#include "layout/region.h"
#include "layout/strided.h"
#include "transform/float_cast.h"

namespace distckpt::internal_plan {
namespace {

std::string shape_str(const Shape& s) { return full_box(s).to_string(); }

// Whether two global shapes differ only by trailing dims of size 1 ([12,2048,1,1] and
// [12,2048]): the same elements in the same row-major order. MindSpore accepts a
// checkpoint shape with extra trailing 1s (its _special_process_par, for GE's 4-D
// tensors); the other direction is the same bytes, so it is accepted too.
bool same_up_to_trailing_ones(const Shape& a, const Shape& b) {
  const Shape& longer = a.size() >= b.size() ? a : b;
  const Shape& shorter = a.size() >= b.size() ? b : a;
  if (!std::equal(shorter.begin(), shorter.end(), longer.begin())) return false;
  return std::all_of(longer.begin() + static_cast<std::ptrdiff_t>(shorter.size()), longer.end(),
                     [](int64_t d) { return d == 1; });
}

// Rewrites a stored tensor's shape and chunk boxes to `to` (same_up_to_trailing_ones):
// trailing dims of size 1 are dropped or added (offset 0, extent 1). A chunk whose
// dropped dim is not offset 0, extent 1 (an empty chunk, say) would change meaning.
Status reshape_trailing_ones(proto::Tensor& t, const Shape& to) {
  const int n = static_cast<int>(to.size());
  for (const proto::Chunk& c : t.chunks())
    for (int d = n; d < c.shape_size(); ++d)
      if (c.offset(d) != 0 || c.shape(d) != 1)
        return corruption("tensor '" + t.name() + "': a chunk of extent " + std::to_string(c.shape(d)) + " at " +
                          std::to_string(c.offset(d)) + " in dim " + std::to_string(d) +
                          " of size 1 cannot be reshaped");
  t.clear_global_shape();
  for (int64_t d : to) t.add_global_shape(d);
  for (proto::Chunk& c : *t.mutable_chunks()) {
    c.mutable_offset()->Truncate(std::min(n, c.offset_size()));
    c.mutable_shape()->Truncate(std::min(n, c.shape_size()));
    while (c.offset_size() < n) c.add_offset(0);
    while (c.shape_size() < n) c.add_shape(1);
  }
  return Status();
}

// The dtype check of one tensor: sets m->staged_dtype for a cast.
Status match_dtype(const TensorEntry& e, const proto::Tensor& t, const LoadOptions& options, MatchedTensor* m) {
  if (t.dtype() == dtype_name(e.dtype)) return Status();
  const std::optional<DType> stored_dtype = dtype_from_name(t.dtype());  // validated with the index
  const bool castable =
      stored_dtype && internal_transform::is_floating(*stored_dtype) && internal_transform::is_floating(e.dtype);
  if (!options.cast_floats || !castable)
    return mismatch("tensor '" + e.name + "': dtype " + std::string(dtype_name(e.dtype)) + " in the state dict, " +
                    t.dtype() + " in the checkpoint" +
                    (castable ? " (LoadOptions::cast_floats converts between floating dtypes)" : ""));
  m->staged_dtype = *stored_dtype;
  return Status();
}

Status match_shape(const TensorEntry& e, proto::Tensor& t, const MatchRules& rules) {
  const Shape stored_shape(t.global_shape().begin(), t.global_shape().end());
  if (stored_shape == e.layout.global_shape()) return Status();
  if (!rules.reshape_trailing_ones || !same_up_to_trailing_ones(stored_shape, e.layout.global_shape()))
    return mismatch("tensor '" + e.name + "': global shape " + shape_str(e.layout.global_shape()) +
                    " in the state dict, " + shape_str(stored_shape) + " in the checkpoint");
  return reshape_trailing_ones(t, e.layout.global_shape());
}

}  // namespace

Result<std::vector<int>> wanted_tensors(const StateDict& state, const LoadOptions& options) {
  std::vector<int> wanted;
  if (options.only.empty()) {
    for (int i = 0; i < static_cast<int>(state.tensors().size()); ++i) wanted.push_back(i);
    return wanted;
  }
  for (const auto& name : options.only) {
    const int i = state.find(name);
    if (i < 0) return invalid_argument("tensor '" + name + "' was asked for but is not in the state dict");
    wanted.push_back(i);
  }
  return wanted;
}

Result<Matching> match_state(const StateDict& state, proto::Index& index, const LoadOptions& options,
                             const MatchRules& rules) {
  Matching out;
  DISTCKPT_ASSIGN_OR_RETURN(out.names, load_names(index, options));
  DISTCKPT_ASSIGN_OR_RETURN(const std::vector<int> wanted, wanted_tensors(state, options));
  const std::map<std::string, int>& stored = out.names.by_state_name;
  std::set<std::string> asked;
  for (int i : wanted) {
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(i)];
    asked.insert(e.name);
    auto it = stored.find(e.name);
    if (it == stored.end()) {
      if (options.strict)
        return mismatch("tensor '" + e.name + "' is not in checkpoint '" + rules.checkpoint + "'" +
                        (out.names.selective ? " (as the load's filters and renames see it)" : ""));
      out.missing_in_checkpoint.push_back(e.name);
      continue;
    }
    proto::Tensor& t = *index.mutable_tensors(it->second);
    MatchedTensor m;
    m.state = i;
    m.stored = it->second;
    if (rules.check_dtypes) DISTCKPT_RETURN_IF_ERROR(match_dtype(e, t, options, &m));
    DISTCKPT_RETURN_IF_ERROR(internal_layout::check_writable(e));
    if (e.strided() && !m.staged_dtype) m.staged_dtype = e.dtype;
    m.read_dtype = m.staged_dtype ? *m.staged_dtype : e.dtype;
    DISTCKPT_RETURN_IF_ERROR(match_shape(e, t, rules));
    if (rules.on_match) DISTCKPT_RETURN_IF_ERROR(rules.on_match(m));
    out.matched.push_back(m);
  }
  for (const auto& [name, i] : stored)  // (a scalar that is also an info value is reported as one)
    if (!asked.count(name) && !out.names.info_scalars.count(name))
      out.unexpected_in_checkpoint.push_back(index.tensors(i).name());
  DISTCKPT_RETURN_IF_ERROR(refuse_unexpected(out.names, state, options, rules.checkpoint));
  return out;
}

}  // namespace distckpt::internal_plan
