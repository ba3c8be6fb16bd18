#include "plan/save_plan.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "google/protobuf/util/message_differencer.h"
#include "plan/load_plan.h"
#include "storage/index_io.h"

namespace distckpt::internal_plan {
namespace {

struct Holder {
  int rank;
  uint32_t local_box;
};

struct Slice {
  uint32_t tensor;
  Box box;
  uint64_t bytes;
  std::vector<Holder> holders;  // ascending rank
  int writer = -1;
  uint32_t writer_box = 0;
};

Status check_consistent(const std::vector<proto::Index>& ranks) {
  const proto::Index& first = ranks[0];
  const int world = static_cast<int>(ranks.size());
  for (const auto& t : first.tensors())
    for (int r : t.layout().ranks())
      if (r >= world)
        return invalid_argument("save: tensor '" + t.name() + "': its layout names rank " + std::to_string(r) +
                                " but the communicator has " + std::to_string(world) +
                                " ranks (is prod(dev_mat) larger than the group?)");
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const proto::Index& other = ranks[r];
    const std::string who = "save: rank " + std::to_string(r);
    for (int t = 0; t < std::max(first.tensors_size(), other.tensors_size()); ++t) {
      if (t >= other.tensors_size())
        return invalid_argument(who + ": tensor '" + first.tensors(t).name() + "' is missing (rank 0 has it)");
      if (t >= first.tensors_size())
        return invalid_argument(who + ": tensor '" + other.tensors(t).name() + "' is not on rank 0");
      const auto& a = first.tensors(t);
      const auto& b = other.tensors(t);
      if (a.name() != b.name())
        return invalid_argument(who + ": tensor #" + std::to_string(t) + " is '" + b.name() + "' but rank 0 has '" +
                                a.name() + "' (state dicts must list the same tensors in the same order)");
      if (a.dtype() != b.dtype())
        return invalid_argument(who + ": tensor '" + a.name() + "': dtype " + b.dtype() + " but rank 0 has " +
                                a.dtype());
      if (!std::equal(a.global_shape().begin(), a.global_shape().end(), b.global_shape().begin(),
                      b.global_shape().end()))
        return invalid_argument(who + ": tensor '" + a.name() + "': global shape differs from rank 0's");
      if (!google::protobuf::util::MessageDifferencer::Equals(a.layout(), b.layout()))
        return invalid_argument(who + ": tensor '" + a.name() + "': layout differs from rank 0's");
    }
  }
  return Status();
}

}  // namespace

proto::Index describe_local_state(const StateDict& state) {
  proto::Index index;
  for (const TensorEntry& e : state.tensors()) {
    proto::Tensor* t = index.add_tensors();
    t->set_name(e.name);
    t->set_dtype(std::string(dtype_name(e.dtype)));
    for (int64_t d : e.layout.global_shape()) t->add_global_shape(d);
    proto::Layout* l = t->mutable_layout();
    for (int64_t d : e.layout.dev_mat()) l->add_dev_mat(d);
    for (int64_t d : e.layout.tensor_map()) l->add_tensor_map(d);
    for (int r : e.layout.ranks()) l->add_ranks(r);
    for (const Box& b : e.boxes) {
      proto::Chunk* c = t->add_chunks();
      for (int64_t o : b.offset) c->add_offset(o);
      for (int64_t s : b.shape) c->add_shape(s);
      c->set_writer_rank(state.rank());
    }
  }
  return index;
}

Result<SavePlan> plan_save(const std::vector<proto::Index>& ranks, bool remove_redundancy) {
  if (ranks.empty()) return invalid_argument("save: no ranks");
  DISTCKPT_RETURN_IF_ERROR(check_consistent(ranks));
  const int world = static_cast<int>(ranks.size());
  const proto::Index& first = ranks[0];

  // Distinct (tensor, box) slices and who holds them. Ranks are visited in order,
  // so holder lists come out sorted.
  std::vector<Slice> slices;
  for (int t = 0; t < first.tensors_size(); ++t) {
    const std::size_t item = dtype_size(*dtype_from_name(first.tensors(t).dtype()));
    std::map<Box, std::size_t> by_box;
    for (int r = 0; r < world; ++r) {
      const auto& chunks = ranks[r].tensors(t).chunks();
      for (int b = 0; b < chunks.size(); ++b) {
        Box box = chunk_box(chunks[b]);
        if (box.num_elements() == 0) continue;
        auto it = remove_redundancy ? by_box.find(box) : by_box.end();
        if (it == by_box.end()) {
          const uint64_t bytes = static_cast<uint64_t>(box.num_elements()) * item;
          if (remove_redundancy) by_box.emplace(box, slices.size());
          slices.push_back(Slice{static_cast<uint32_t>(t), std::move(box), bytes, {}});
          slices.back().holders.push_back(Holder{r, static_cast<uint32_t>(b)});
        } else {
          slices[it->second].holders.push_back(Holder{r, static_cast<uint32_t>(b)});
        }
      }
    }
  }

  // Greedy balance: fewest holders first, largest first, to the least-loaded holder.
  std::vector<std::size_t> order(slices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const Slice& a = slices[x];
    const Slice& b = slices[y];
    if (a.holders.size() != b.holders.size()) return a.holders.size() < b.holders.size();
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    return a.box < b.box;
  });
  SavePlan plan;
  plan.bytes_per_rank.assign(world, 0);
  for (std::size_t i : order) {
    Slice& s = slices[i];
    const Holder* best = &s.holders[0];
    for (const Holder& h : s.holders)
      if (plan.bytes_per_rank[h.rank] < plan.bytes_per_rank[best->rank]) best = &h;
    s.writer = best->rank;
    s.writer_box = best->local_box;
    plan.bytes_per_rank[best->rank] += s.bytes;
  }

  // Index skeleton: tensors in state-dict order, chunks sorted by box; each writer's
  // file holds its chunks in index order, packed back to back.
  plan.index.set_world_size(world);
  plan.index.set_format("native");
  plan.index.mutable_transforms()->set_checksum("crc32c");
  plan.index.mutable_transforms()->set_encryption("none");
  plan.index.mutable_transforms()->set_compression("none");
  std::vector<std::size_t> by_tensor(slices.size());
  for (std::size_t i = 0; i < by_tensor.size(); ++i) by_tensor[i] = i;
  std::stable_sort(by_tensor.begin(), by_tensor.end(), [&](std::size_t x, std::size_t y) {
    if (slices[x].tensor != slices[y].tensor) return slices[x].tensor < slices[y].tensor;
    if (!(slices[x].box == slices[y].box)) return slices[x].box < slices[y].box;
    return slices[x].writer < slices[y].writer;
  });
  std::vector<int> file_of_rank(world, -1);
  for (int r = 0; r < world; ++r) {
    if (plan.bytes_per_rank[r] == 0) continue;
    file_of_rank[r] = plan.index.files_size();
    proto::File* f = plan.index.add_files();
    f->set_name(internal_storage::data_file_name(r));
    f->set_size(plan.bytes_per_rank[r]);
  }
  for (int t = 0; t < first.tensors_size(); ++t) {
    proto::Tensor* dst = plan.index.add_tensors();
    *dst = first.tensors(t);
    dst->clear_chunks();
  }
  plan.writes.assign(world, {});
  std::vector<uint64_t> cursor(world, 0);
  for (std::size_t i : by_tensor) {
    const Slice& s = slices[i];
    proto::Tensor* t = plan.index.mutable_tensors(static_cast<int>(s.tensor));
    const uint32_t chunk_no = static_cast<uint32_t>(t->chunks_size());
    proto::Chunk* c = t->add_chunks();
    for (int64_t o : s.box.offset) c->add_offset(o);
    for (int64_t d : s.box.shape) c->add_shape(d);
    c->set_file_id(static_cast<uint32_t>(file_of_rank[s.writer]));
    c->set_byte_offset(cursor[s.writer]);
    c->set_length(s.bytes);
    c->set_writer_rank(s.writer);
    plan.writes[s.writer].push_back(WriteItem{s.tensor, s.writer_box, chunk_no, cursor[s.writer], s.bytes});
    cursor[s.writer] += s.bytes;
  }
  // The planned index must pass the checks every reader applies (the boxes of all
  // ranks tile each tensor, ...): never commit what load would refuse.
  Status valid = internal_storage::validate_index(plan.index, "save plan");
  if (!valid.ok()) return invalid_argument(valid.message());
  return plan;
}

std::string encode_writes(const std::vector<WriteItem>& items) {
  std::string out(items.size() * sizeof(WriteItem), '\0');
  if (!items.empty()) std::memcpy(out.data(), items.data(), out.size());  // same binary on every rank
  return out;
}

Result<std::vector<WriteItem>> decode_writes(const std::string& bytes) {
  if (bytes.size() % sizeof(WriteItem) != 0) return internal_error("save: malformed write list");
  std::vector<WriteItem> items(bytes.size() / sizeof(WriteItem));
  if (!items.empty()) std::memcpy(items.data(), bytes.data(), bytes.size());
  return items;
}

}  // namespace distckpt::internal_plan
