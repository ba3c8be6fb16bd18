// load_all: a checkpoint's tensors into buffers allocated here, laid out whole on every
// rank or as they were saved; then an ordinary load() into them.
#include <cstddef>
#include <limits>

#include "base/guard.h"
#include "collective/fetch_index.h"
#include "plan/load_names.h"
#include "comm/agree.h"
#include "comm/local_comm.h"
#include "distckpt/checkpoint.h"
#include "format/native/sealing.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt {

namespace {

Box chunk_box(const proto::Chunk& c) {
  return Box{Shape(c.offset().begin(), c.offset().end()), Shape(c.shape().begin(), c.shape().end())};
}

// The layout a stored tensor had at save. Explicit layouts keep only the boxes each
// writer wrote (replicas were written once), and a tensor described without a layout
// (a foreign single file) was saved whole, by rank 0.
Result<TensorLayout> stored_layout(const proto::Tensor& t) {
  const Shape shape(t.global_shape().begin(), t.global_shape().end());
  const proto::Layout& l = t.layout();
  if (l.dev_mat_size() > 0) {
    std::vector<int> ranks(l.ranks().begin(), l.ranks().end());
    if (ranks.empty()) {
      int64_t members = 1;
      for (int64_t d : l.dev_mat()) members *= d;  // validated with the index
      for (int64_t i = 0; i < members; ++i) ranks.push_back(l.ranks_first() + static_cast<int>(i));
    }
    return TensorLayout::from_device_matrix(shape, Shape(l.dev_mat().begin(), l.dev_mat().end()),
                                            Shape(l.tensor_map().begin(), l.tensor_map().end()), std::move(ranks));
  }
  std::map<int, std::vector<Box>> by_writer;
  for (const auto& c : t.chunks()) by_writer[std::max(c.writer_rank(), 0)].push_back(chunk_box(c));
  if (by_writer.empty()) by_writer[0].push_back(Box{Shape(shape.size(), 0), shape});
  std::vector<int> ranks;
  std::vector<std::vector<Box>> boxes;
  for (auto& [rank, held] : by_writer) ranks.push_back(rank), boxes.push_back(std::move(held));
  return TensorLayout::from_boxes(shape, std::move(boxes), std::move(ranks));
}

}  // namespace

Result<LoadedCheckpoint> load_all(Comm& comm, const std::string& path, LoadAllLayout layout, const LoadOptions& options) {
  const std::string where = "load_all: rank " + std::to_string(comm.rank());
  std::shared_ptr<FileSystem> fs = internal_format::with_key(internal_storage::filesystem_for(path, options.fs), options.key.get());
  if (!options.only.empty())  // the same on every rank: the options are the call's
    return invalid_argument(where + ": `only` names state tensors; choose with specify_prefix/filter_prefix/choice_func");
  DISTCKPT_ASSIGN_OR_RETURN(internal_collective::FetchedIndex fetched,
                            internal_collective::fetch_index(comm, fs, path, where));
  LoadedCheckpoint out;
  out.path = fetched.path;
  out.state = StateDict(comm.rank());
  Status local = internal_base::guarded(where, [&]() -> Status {
    proto::Index& index = fetched.index;
    DISTCKPT_RETURN_IF_ERROR(internal_format::open_index(&index, options.key.get(), fetched.path).status());
    DISTCKPT_ASSIGN_OR_RETURN(internal_plan::LoadNames names, internal_plan::load_names(index, options));
    for (const auto& [name, i] : names.by_state_name) {
      const proto::Tensor& t = index.tensors(i);
      const std::optional<DType> dtype = dtype_from_name(t.dtype());
      if (!dtype) return corruption("tensor '" + t.name() + "': unknown dtype '" + t.dtype() + "'");
      const Shape shape(t.global_shape().begin(), t.global_shape().end());
      TensorLayout chosen;
      if (layout == LoadAllLayout::kFull) {
        DISTCKPT_ASSIGN_OR_RETURN(chosen, TensorLayout::from_device_matrix(shape, {comm.size()}, Shape(shape.size(), -1)));
      } else {
        DISTCKPT_ASSIGN_OR_RETURN(chosen, stored_layout(t));
        if (chosen.max_rank() >= comm.size())
          return invalid_argument("tensor '" + t.name() + "' was saved over ranks up to " + std::to_string(chosen.max_rank()) +
                                  ": its stored layout needs at least " + std::to_string(chosen.max_rank() + 1) +
                                  " ranks, not " + std::to_string(comm.size()));
      }
      std::vector<void*> buffers;
      for (const Box& box : chosen.boxes_of(comm.rank())) {
        const uint64_t elements = static_cast<uint64_t>(box.num_elements());
        if (elements > std::numeric_limits<std::size_t>::max() / dtype_size(*dtype))
          return invalid_argument("tensor '" + name + "' is too large for this machine");
        const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(*dtype);
        out.storage.emplace_back(new std::byte[bytes == 0 ? 1 : bytes]);
        buffers.push_back(out.storage.back().get());
      }
      if (buffers.empty()) buffers.push_back(nullptr);  // not a member of the group: holds nothing
      DISTCKPT_RETURN_IF_ERROR(buffers.size() == 1 ? out.state.add_tensor(name, *dtype, buffers[0], chosen)
                                                   : out.state.add_tensor(name, *dtype, buffers, chosen));
    }
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, local));
  LoadOptions read = options;
  read.strict = true;  // every tensor described above is there
  DISTCKPT_ASSIGN_OR_RETURN(out.result, load(comm, out.state, out.path, read));
  out.step = out.result.step;
  out.epoch = out.result.epoch;
  out.info = out.result.info;
  return out;
}

Result<LoadedCheckpoint> load_all(const std::string& path, const LoadOptions& options) {
  std::vector<std::unique_ptr<Comm>> self = internal_comm::make_local_comms(1);
  return load_all(*self[0], path, LoadAllLayout::kFull, options);
}

}  // namespace distckpt
