// Load planning: which stored chunks a rank reads for the boxes it needs.
#pragma once

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "distckpt/layout.h"
#include "distckpt_index.pb.h"
#include "format/chunk_reader.h"

namespace distckpt::internal_plan {

// A planned read is the read engine's unit of work (format/chunk_reader.h).
using ReadItem = internal_format::ChunkRead;
using internal_format::chunk_box;

// The chunks of one stored tensor, indexed for box queries: sorted by offset along the
// dim with the most distinct chunk offsets, so that a query looks only at chunks that
// can overlap the needed box on that dim (O(log chunks + candidates) for the slab and
// grid splits layouts produce) instead of at every chunk. Local; copies what it needs.
class ChunkLookup {
 public:
  explicit ChunkLookup(const proto::Tensor& tensor);

  // The reads that fill `needed`, in chunk order. A chunk equal to `needed` is one whole
  // read; otherwise every overlapping chunk gives its intersection, and identical
  // stored boxes (saves without redundancy removal) are used once. Sets *covered to
  // the number of needed elements the reads provide (== needed.num_elements() when the
  // checkpoint covers it).
  std::vector<ReadItem> plan_reads(const Box& needed, int64_t* covered) const;

  std::size_t chunk_count() const { return boxes_.size(); }

 private:
  std::vector<Box> boxes_;        // per chunk
  int dim_ = -1;                  // the sorted dim; -1 for 0-d tensors (every chunk is a candidate)
  std::vector<int> order_;        // non-empty chunks by offset on dim_
  std::vector<int64_t> starts_;   // their offsets on dim_
  int64_t max_extent_ = 0;        // the largest chunk extent on dim_
};

// One rank's replica groups when replicas share reads, and who reads each box a group
// needs. Every member of a group makes the same calls in the same order and so derives
// the same readers without communicating. Tensors whose layouts give the same members
// share one entry. For a device-matrix layout over a contiguous group the entry is found
// by a key of O(axes) numbers, so the member list is built once per distinct key, not
// per tensor.
class ReplicaGroups {
 public:
  explicit ReplicaGroups(int rank) : rank_(rank) {}
  // The entry of this rank's group in `layout` (precondition: the rank is a member).
  int group_of(const TensorLayout& layout);
  // Its members: global ranks, ascending, this rank included.
  const std::vector<int>& members(int group) const { return members_[static_cast<std::size_t>(group)]; }
  // First pass: a box of `bytes` (> 0) bytes that the group needs, whose stored bytes
  // start at `offset` of file `file`. Returns the box's number for reader().
  int need(int group, uint32_t file, uint64_t offset, uint64_t bytes);
  // After the last need(): the group's boxes in storage order (file, offset, then the
  // order of need) are cut into one stretch per member, in member order, each about an
  // equal share of the bytes (a box is never split). Each member then reads long
  // sequential runs of the files: direct reads take whole 8 MiB windows, where boxes
  // dealt out in turn would leave one read per chunk.
  void assign();
  // The member that reads box `box` (after assign()).
  int reader(int box) const { return boxes_[static_cast<std::size_t>(box)].reader; }
  // The members of box `box`'s group.
  const std::vector<int>& members_of(int box) const { return members(boxes_[static_cast<std::size_t>(box)].group); }

 private:
  struct Needed {
    int group;
    uint32_t file;
    uint64_t offset, bytes;
    int reader = -1;
  };
  int rank_;
  std::map<std::vector<int64_t>, int> by_key_;  // contiguous device-matrix groups
  std::map<std::vector<int>, int> by_members_;  // the others, by member list
  std::vector<std::vector<int>> members_;
  std::vector<Needed> boxes_;
  int add(std::vector<int> members);
  int by_members(std::vector<int> members);
};

// One query without keeping the lookup.
std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered);

}  // namespace distckpt::internal_plan
