#include "plan/save_plan.h"

#include "transform/cipher.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "google/protobuf/util/message_differencer.h"
#include "layout/slices.h"
#include "plan/load_plan.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "transform/sha256.h"

namespace distckpt::internal_plan {
namespace {

struct Holder {
  int rank;
  uint32_t local_box;
};

// A distinct box to write. Device-matrix slices (with redundancy removal) compute
// their holders from the layout; the others list them in `flat` [holders_at, +count).
struct Slice {
  uint32_t tensor;
  int64_t device_slice;  // -1: holders listed
  std::size_t holders_at;
  uint32_t holder_count;
  Box box;
  uint64_t bytes;
  int writer = -1;
  uint32_t writer_box = 0;
};

// WriterChoice::kMindSpore (save_plan.h): slices in tensor order (then box order); the
// slices of each holder set dealt round-robin over its holders in rank order.
void deal_as_mindspore(std::vector<Slice>& slices, const std::function<std::vector<Holder>(const Slice&)>& holders_of,
                       std::vector<uint64_t>& bytes_per_rank) {
  std::vector<std::size_t> in_order(slices.size());
  for (std::size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  std::stable_sort(in_order.begin(), in_order.end(), [&](std::size_t x, std::size_t y) {
    return std::tie(slices[x].tensor, slices[x].box) < std::tie(slices[y].tensor, slices[y].box);
  });
  std::map<std::vector<int>, std::size_t> dealt;  // holder ranks -> slices given so far
  for (std::size_t i : in_order) {
    Slice& s = slices[i];
    std::vector<Holder> holders = holders_of(s);
    std::sort(holders.begin(), holders.end(), [](const Holder& a, const Holder& b) { return a.rank < b.rank; });
    std::vector<int> ranks;
    for (const Holder& h : holders) ranks.push_back(h.rank);
    const Holder& chosen = holders[dealt[ranks]++ % holders.size()];
    s.writer = chosen.rank;
    s.writer_box = chosen.local_box;
    bytes_per_rank[static_cast<std::size_t>(s.writer)] += s.bytes;
  }
}

// The first rank (in group order) of a layout that is outside the world.
int first_rank_outside(const TensorLayout& layout, int world) {
  for (int r : layout.ranks())
    if (r >= world) return r;
  return layout.max_rank();
}

}  // namespace

std::vector<PlannedTensor> planned_tensors(const StateDict& state) {
  std::vector<PlannedTensor> out;
  out.reserve(state.tensors().size());
  for (const TensorEntry& e : state.tensors()) out.push_back(PlannedTensor{e.name, e.dtype, &e.layout});
  return out;
}

void describe_tensor(const PlannedTensor& tensor, bool member_boxes, proto::Tensor* t) {
  const TensorLayout& layout = *tensor.layout;
  t->set_name(tensor.name);
  t->set_dtype(std::string(dtype_name(tensor.dtype)));
  for (int64_t d : layout.global_shape()) t->add_global_shape(d);
  proto::Layout* l = t->mutable_layout();
  for (int64_t d : layout.dev_mat()) l->add_dev_mat(d);
  for (int64_t d : layout.tensor_map()) l->add_tensor_map(d);
  if (layout.is_device_matrix() && layout.contiguous_first_rank() >= 0) {
    l->set_ranks_first(layout.contiguous_first_rank());
  } else {
    for (int r : layout.ranks()) l->add_ranks(r);
  }
  if (member_boxes && !layout.is_device_matrix()) {
    for (int r : layout.ranks())
      for (const Box& b : layout.boxes_of(r)) {
        proto::Chunk* c = t->add_chunks();
        for (int64_t o : b.offset) c->add_offset(o);
        for (int64_t s : b.shape) c->add_shape(s);
        c->set_writer_rank(r);
      }
  }
}

std::string describe_tensors(const std::vector<PlannedTensor>& tensors) {
  proto::Index index;
  for (const PlannedTensor& t : tensors) describe_tensor(t, /*member_boxes=*/true, index.add_tensors());
  return internal_format::serialize_deterministic(index);
}

std::string describe_state(const StateDict& state) { return describe_tensors(planned_tensors(state)); }

Result<std::vector<int64_t>> fingerprint(const std::string& description) {
  const std::string hex = internal_transform::sha256_hex(description.data(), description.size());
  if (hex.size() != 16 * kFingerprintWords) return internal_error("save: SHA-256 of the state description failed");
  std::vector<int64_t> words;
  for (std::size_t i = 0; i < hex.size(); i += 16)
    words.push_back(static_cast<int64_t>(std::stoull(hex.substr(i, 16), nullptr, 16)));
  return words;
}

Status explain_mismatch(const std::string& rank0, const std::string& other_bytes, int other_rank) {
  proto::Index first, other;
  if (!first.ParseFromString(rank0)) return internal_error("save: the description of rank 0 does not parse");
  if (!other.ParseFromString(other_bytes))
    return internal_error("save: the description of rank " + std::to_string(other_rank) + " does not parse");
  using google::protobuf::util::MessageDifferencer;
  const std::string who = "save: rank " + std::to_string(other_rank);
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
      return invalid_argument(who + ": tensor '" + a.name() + "': dtype " + b.dtype() + " but rank 0 has " + a.dtype());
    if (!std::equal(a.global_shape().begin(), a.global_shape().end(), b.global_shape().begin(),
                    b.global_shape().end()))
      return invalid_argument(who + ": tensor '" + a.name() + "': global shape differs from rank 0's");
    if (!MessageDifferencer::Equals(a.layout(), b.layout()))
      return invalid_argument(who + ": tensor '" + a.name() + "': layout differs from rank 0's");
    if (a.chunks_size() != b.chunks_size() ||
        !std::equal(a.chunks().begin(), a.chunks().end(), b.chunks().begin(),
                    [](const proto::Chunk& x, const proto::Chunk& y) { return MessageDifferencer::Equals(x, y); }))
      return invalid_argument(who + ": tensor '" + a.name() + "': explicit boxes differ from rank 0's");
  }
  if (!MessageDifferencer::Equals(first, other))
    return invalid_argument(who + ": its state dict's description differs from rank 0's");
  return Status();
}

namespace {

// The plan's index skeleton and each rank's writes, once every slice has its writer:
// tensors in state-dict order, chunks sorted by box; each writer's file holds its chunks
// in index order, each at the next chunk_start.
void describe_plan(const std::vector<PlannedTensor>& tensors, const std::vector<Slice>& slices, int world,
                   SavePlan* out) {
  SavePlan& plan = *out;
  plan.index.set_world_size(world);
  plan.index.set_format("native");
  plan.index.mutable_transforms()->set_checksum("crc32c");
  plan.index.mutable_transforms()->set_encryption("none");
  plan.index.mutable_transforms()->set_compression("none");
  std::vector<std::size_t> by_tensor(slices.size());
  for (std::size_t i = 0; i < by_tensor.size(); ++i) by_tensor[i] = i;
  std::sort(by_tensor.begin(), by_tensor.end(), [&](std::size_t x, std::size_t y) {
    const Slice& a = slices[x];
    const Slice& b = slices[y];
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    if (!(a.box == b.box)) return a.box < b.box;
    return a.writer < b.writer;
  });
  std::vector<int> file_of_rank(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    if (plan.bytes_per_rank[r] == 0) continue;
    file_of_rank[r] = plan.index.files_size();
    proto::File* f = plan.index.add_files();
    f->set_name(internal_format::data_file_name(r));
  }
  for (const PlannedTensor& t : tensors) describe_tensor(t, /*member_boxes=*/false, plan.index.add_tensors());
  plan.writes.assign(static_cast<std::size_t>(world), {});
  std::vector<uint64_t> cursor(static_cast<std::size_t>(world), 0);
  for (std::size_t i : by_tensor) {
    const Slice& s = slices[i];
    proto::Tensor* t = plan.index.mutable_tensors(static_cast<int>(s.tensor));
    const uint32_t chunk_no = static_cast<uint32_t>(t->chunks_size());
    proto::Chunk* c = t->add_chunks();
    for (int64_t o : s.box.offset) c->add_offset(o);
    for (int64_t d : s.box.shape) c->add_shape(d);
    const uint64_t at = internal_format::chunk_start(cursor[s.writer]);
    c->set_file_id(static_cast<uint32_t>(file_of_rank[s.writer]));
    c->set_byte_offset(at);
    c->set_length(s.bytes);
    c->set_writer_rank(s.writer);
    plan.writes[s.writer].push_back(WriteItem{s.tensor, s.writer_box, chunk_no, at, s.bytes, s.bytes});
    cursor[s.writer] = at + s.bytes;
  }
  for (int r = 0; r < world; ++r)
    if (file_of_rank[r] >= 0) plan.index.mutable_files(file_of_rank[r])->set_size(cursor[r]);
}

}  // namespace

Result<SavePlan> plan_save(const std::vector<PlannedTensor>& tensors, int world, bool remove_redundancy,
                           const std::vector<int>* node_of, WriterChoice choice) {
  if (world < 1) return invalid_argument("save: no ranks");
  for (const PlannedTensor& t : tensors)
    if (t.layout->max_rank() >= world)
      return invalid_argument("save: tensor '" + t.name + "': its layout names rank " +
                              std::to_string(first_rank_outside(*t.layout, world)) + " but the communicator has " +
                              std::to_string(world) + " ranks (is prod(dev_mat) larger than the group?)");

  // Distinct (tensor, box) slices and who holds them.
  std::vector<Slice> slices;
  std::vector<Holder> flat;
  std::vector<std::unique_ptr<internal_layout::DeviceSlices>> device(tensors.size());
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const TensorLayout& layout = *tensors[ti].layout;
    const uint32_t t = static_cast<uint32_t>(ti);
    const uint64_t item = dtype_size(tensors[ti].dtype);
    auto add = [&](Box box, int64_t device_slice, std::size_t holders_at, uint32_t count) {
      const uint64_t bytes = static_cast<uint64_t>(box.num_elements()) * item;
      slices.push_back(Slice{t, device_slice, holders_at, count, std::move(box), bytes});
    };
    if (layout.is_device_matrix()) {
      device[ti] = std::make_unique<internal_layout::DeviceSlices>(layout);
      const auto& ds = *device[ti];
      for (int64_t s = 0; s < ds.count(); ++s) {
        Box box = ds.box(s);
        if (box.num_elements() == 0) continue;
        if (remove_redundancy) {
          add(std::move(box), s, 0, static_cast<uint32_t>(ds.replicas()));
        } else {
          ds.for_each_holder(s, [&](int member) {
            flat.push_back(Holder{layout.ranks()[member], 0});
            add(box, -1, flat.size() - 1, 1);
          });
        }
      }
      continue;
    }
    // Explicit boxes: members in rank order, so holder lists come out sorted.
    std::vector<int> members(static_cast<std::size_t>(layout.group_size()));
    for (std::size_t m = 0; m < members.size(); ++m) members[m] = static_cast<int>(m);
    std::sort(members.begin(), members.end(), [&](int x, int y) { return layout.ranks()[x] < layout.ranks()[y]; });
    std::map<Box, std::vector<Holder>> by_box;
    std::vector<std::pair<Box, std::vector<Holder>>> own;  // without redundancy removal
    for (int m : members) {
      const int rank = layout.ranks()[m];
      const std::vector<Box> boxes = layout.boxes_of(rank);
      for (std::size_t b = 0; b < boxes.size(); ++b) {
        if (boxes[b].num_elements() == 0) continue;
        const Holder h{rank, static_cast<uint32_t>(b)};
        if (remove_redundancy) by_box[boxes[b]].push_back(h);
        else own.push_back({boxes[b], {h}});
      }
    }
    auto emit = [&](const Box& box, const std::vector<Holder>& holders) {
      add(box, -1, flat.size(), static_cast<uint32_t>(holders.size()));
      flat.insert(flat.end(), holders.begin(), holders.end());
    };
    for (const auto& [box, holders] : by_box) emit(box, holders);
    for (const auto& [box, holders] : own) emit(box, holders);
  }
  auto for_each_holder = [&](const Slice& s, auto&& fn) {
    if (s.device_slice < 0) {
      for (std::size_t i = s.holders_at; i < s.holders_at + s.holder_count; ++i) fn(flat[i]);
      return;
    }
    const auto& ranks = tensors[s.tensor].layout->ranks();
    device[s.tensor]->for_each_holder(s.device_slice, [&](int member) { fn(Holder{ranks[member], 0}); });
  };
  if (node_of != nullptr && remove_redundancy) {
    // One copy per node: each slice becomes one slice per node among its holders.
    std::vector<Slice> per_node;
    std::vector<Holder> node_flat;
    for (const Slice& s : slices) {
      std::map<int, std::vector<Holder>> by_node;
      for_each_holder(s, [&](const Holder& h) { by_node[(*node_of)[static_cast<std::size_t>(h.rank)]].push_back(h); });
      for (const auto& [node, holders] : by_node) {
        per_node.push_back(Slice{s.tensor, -1, node_flat.size(), static_cast<uint32_t>(holders.size()), s.box, s.bytes});
        node_flat.insert(node_flat.end(), holders.begin(), holders.end());
      }
    }
    slices = std::move(per_node);
    flat = std::move(node_flat);
  }

  SavePlan plan;
  plan.bytes_per_rank.assign(static_cast<std::size_t>(world), 0);
  if (choice == WriterChoice::kMindSpore)
    deal_as_mindspore(slices, [&](const Slice& s) {
      std::vector<Holder> holders;
      for_each_holder(s, [&](const Holder& h) { holders.push_back(h); });
      return holders;
    }, plan.bytes_per_rank);

  // Greedy balance: fewest holders first, largest first, to the least-loaded holder.
  std::vector<std::size_t> order(choice == WriterChoice::kMindSpore ? 0 : slices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const Slice& a = slices[x];
    const Slice& b = slices[y];
    if (a.holder_count != b.holder_count) return a.holder_count < b.holder_count;
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    return a.box < b.box;
  });
  for (std::size_t i : order) {
    Slice& s = slices[i];
    for_each_holder(s, [&](const Holder& h) {
      if (s.writer < 0 || std::tie(plan.bytes_per_rank[h.rank], h.rank) < std::tie(plan.bytes_per_rank[s.writer], s.writer)) {
        s.writer = h.rank;
        s.writer_box = h.local_box;
      }
    });
    plan.bytes_per_rank[s.writer] += s.bytes;
  }

  describe_plan(tensors, slices, world, &plan);
  // The planned index must pass the checks every reader applies (the boxes of all
  // ranks tile each tensor, ...): never commit what load would refuse.
  Status valid = internal_format::validate_index(plan.index, "save plan");
  if (!valid.ok()) return invalid_argument(valid.message());
  return plan;
}

void apply_encryption(const internal_transform::CheckpointCipher& cipher, SavePlan* plan) {
  std::vector<uint64_t> file_size(static_cast<std::size_t>(plan->index.files_size()), 0);
  for (auto& items : plan->writes) {
    uint64_t cursor = 0;
    for (WriteItem& item : items) {
      item.byte_offset = internal_format::chunk_start(cursor);
      item.stored_length = cipher.stored_length(item.length);
      cursor = item.byte_offset + item.stored_length;
      proto::Chunk* c = plan->index.mutable_tensors(static_cast<int>(item.tensor))->mutable_chunks(static_cast<int>(item.chunk));
      c->set_byte_offset(item.byte_offset);
      c->set_length(item.stored_length);
      c->set_nonce(cipher.chunk_nonce(item.tensor, item.chunk));
      file_size[c->file_id()] = cursor;
    }
  }
  for (int f = 0; f < plan->index.files_size(); ++f) plan->index.mutable_files(f)->set_size(file_size[static_cast<std::size_t>(f)]);
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
