#include "plan/load_plan.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace distckpt::internal_plan {


ChunkLookup::ChunkLookup(const proto::Tensor& tensor) {
  boxes_.reserve(static_cast<std::size_t>(tensor.chunks_size()));
  for (const auto& c : tensor.chunks()) boxes_.push_back(chunk_box(c));
  const int dims = tensor.global_shape_size();
  std::size_t best = 0;
  for (int d = 0; d < dims; ++d) {
    std::vector<int64_t> starts;
    for (const Box& b : boxes_)
      if (static_cast<int>(b.offset.size()) == dims) starts.push_back(b.offset[d]);
    std::sort(starts.begin(), starts.end());
    const auto distinct = static_cast<std::size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
    if (dim_ < 0 || distinct > best) best = distinct, dim_ = d;
  }
  for (int c = 0; c < static_cast<int>(boxes_.size()); ++c)
    if (!boxes_[c].empty() && static_cast<int>(boxes_[c].offset.size()) == dims) order_.push_back(c);
  if (dim_ >= 0) {
    std::sort(order_.begin(), order_.end(), [&](int x, int y) {
      return std::tie(boxes_[x].offset[dim_], x) < std::tie(boxes_[y].offset[dim_], y);
    });
    for (int c : order_) {
      starts_.push_back(boxes_[c].offset[dim_]);
      max_extent_ = std::max(max_extent_, boxes_[c].shape[dim_]);
    }
  }
}

std::vector<ReadItem> ChunkLookup::plan_reads(const Box& needed, int64_t* covered) const {
  std::vector<ReadItem> reads;
  *covered = 0;
  if (needed.empty()) return reads;
  // Candidates: chunks starting on dim_ after (needed's start - the largest extent) and
  // before needed's end; the others cannot overlap it.
  std::vector<int> candidates;
  if (dim_ < 0) {
    candidates = order_;
  } else {
    const int64_t lo = needed.offset[dim_] - max_extent_, hi = needed.offset[dim_] + needed.shape[dim_];
    auto first = std::upper_bound(starts_.begin(), starts_.end(), lo);
    auto last = std::lower_bound(first, starts_.end(), hi);
    for (auto it = first; it != last; ++it) candidates.push_back(order_[static_cast<std::size_t>(it - starts_.begin())]);
  }
  std::sort(candidates.begin(), candidates.end());
  // An exact match serves the whole box with one read and no copy.
  for (int c : candidates)
    if (boxes_[c] == needed) {
      reads.push_back(ReadItem{c, needed, true});
      *covered = needed.num_elements();
      return reads;
    }
  std::set<Box> seen;
  for (int c : candidates) {
    Box region = intersect(boxes_[c], needed);
    if (region.empty() || !seen.insert(boxes_[c]).second) continue;
    *covered += region.num_elements();
    reads.push_back(ReadItem{c, std::move(region), false});
  }
  return reads;
}

int ReplicaGroups::add(std::vector<int> members) {
  members_.push_back(std::move(members));
  return static_cast<int>(members_.size()) - 1;
}

int ReplicaGroups::need(int group, uint32_t file, uint64_t offset, uint64_t bytes) {
  boxes_.push_back(Needed{group, file, offset, bytes});
  return static_cast<int>(boxes_.size()) - 1;
}

void ReplicaGroups::assign() {
  std::vector<std::vector<int>> of_group(members_.size());
  for (std::size_t b = 0; b < boxes_.size(); ++b) of_group[static_cast<std::size_t>(boxes_[b].group)].push_back(static_cast<int>(b));
  for (std::size_t g = 0; g < of_group.size(); ++g) {
    std::vector<int>& order = of_group[g];
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      const Needed &a = boxes_[static_cast<std::size_t>(x)], &b = boxes_[static_cast<std::size_t>(y)];
      return std::tie(a.file, a.offset, x) < std::tie(b.file, b.offset, y);
    });
    long double total = 0;
    for (int b : order) total += static_cast<long double>(boxes_[static_cast<std::size_t>(b)].bytes);
    const std::vector<int>& members = members_[g];
    const auto count = static_cast<long double>(members.size());
    long double before = 0;  // bytes of the boxes ahead in storage order
    for (int b : order) {
      Needed& box = boxes_[static_cast<std::size_t>(b)];
      // The member whose share holds the box's middle byte.
      const long double middle = before + static_cast<long double>(box.bytes) / 2;
      const auto m = std::min(members.size() - 1, static_cast<std::size_t>(middle / total * count));
      box.reader = members[m];
      before += static_cast<long double>(box.bytes);
    }
  }
}

int ReplicaGroups::group_of(const TensorLayout& layout) {
  if (layout.is_device_matrix() && layout.contiguous_first_rank() >= 0) {
    // The group is the members agreeing with this rank on the axes the tensor map
    // names: (first rank, dev_mat, per axis: this rank's coordinate or -1 if unnamed).
    const Shape& dev = layout.dev_mat();
    const int64_t naxes = static_cast<int64_t>(dev.size());
    std::vector<bool> named(dev.size(), false);
    for (int64_t k : layout.tensor_map())
      if (k >= 0) named[static_cast<std::size_t>(naxes - 1 - k)] = true;
    std::vector<int64_t> key{layout.contiguous_first_rank()};
    key.insert(key.end(), dev.begin(), dev.end());
    int64_t idx = layout.group_index(rank_);
    std::vector<int64_t> coords(dev.size());
    for (int64_t a = naxes - 1; a >= 0; --a) {
      coords[static_cast<std::size_t>(a)] = named[static_cast<std::size_t>(a)] ? idx % dev[a] : -1;
      idx /= dev[a];
    }
    key.insert(key.end(), coords.begin(), coords.end());
    auto it = by_key_.find(key);
    if (it != by_key_.end()) return it->second;
    const int group = by_members(layout.replica_group(rank_));
    by_key_.emplace(std::move(key), group);
    return group;
  }
  return by_members(layout.replica_group(rank_));
}

int ReplicaGroups::by_members(std::vector<int> members) {
  auto it = by_members_.find(members);
  if (it != by_members_.end()) return it->second;
  const int group = add(members);
  by_members_.emplace(std::move(members), group);
  return group;
}

std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered) {
  return ChunkLookup(tensor).plan_reads(needed, covered);
}

}  // namespace distckpt::internal_plan
