#include "format/ckpt/strategy.h"

#include "mindspore_strategy.pb.h"

namespace distckpt::internal_format {

namespace {

// Why `t`'s layout has no strategy, or "" when it has one.
std::string inexpressible(const proto::Tensor& t, int64_t world) {
  const proto::Layout& layout = t.layout();
  if (layout.dev_mat().empty()) return "its layout is explicit boxes";
  int64_t devices = 1;
  for (int64_t d : layout.dev_mat()) devices *= d;
  if (devices != world)
    return "its device matrix covers " + std::to_string(devices) + " of the " + std::to_string(world) + " ranks";
  if (layout.ranks().empty()) {
    if (layout.ranks_first() != 0) return "its ranks start at " + std::to_string(layout.ranks_first());
  } else {
    for (int i = 0; i < layout.ranks_size(); ++i)
      if (layout.ranks(i) != i) return "its ranks are not 0 .. " + std::to_string(world - 1) + " in order";
  }
  for (int64_t m : layout.tensor_map())
    if (m < -1 || m >= layout.dev_mat_size()) return "its tensor map names no device axis";
  return "";
}

}  // namespace

Result<std::string> mindspore_strategy(const proto::Index& index) {
  mindspore_strategy::ParallelStrategyMap map;
  map.set_current_stage(0);
  for (const proto::Tensor& t : index.tensors()) {
    const std::string why = inexpressible(t, index.world_size());
    if (!why.empty()) return unsupported("no MindSpore strategy: tensor '" + t.name() + "': " + why);
    auto* item = map.add_parallel_layout_item();
    item->set_param_name(t.name());
    auto* layouts = item->mutable_parallel_layouts();
    auto* dev = layouts->add_dev_matrix();
    for (int64_t d : t.layout().dev_mat()) dev->add_dim(static_cast<uint32_t>(d));
    auto* tensor_map = layouts->add_tensor_map();
    for (int64_t m : t.layout().tensor_map()) tensor_map->add_dim(static_cast<int32_t>(m));
    // As MindSpore's own writer: one (empty) split shape and offset list per parameter.
    layouts->add_param_split_shape();
    layouts->add_indices_offset();
    layouts->set_field(0);
    layouts->set_opt_weight_shard_step(0);
    layouts->set_opt_weight_shard_size(0);
  }
  std::string bytes;
  if (!map.SerializeToString(&bytes)) return internal_error("the MindSpore strategy does not serialize");
  return bytes;
}

}  // namespace distckpt::internal_format
