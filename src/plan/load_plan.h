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
// needs: the member with the fewest bytes so far (ties: the lowest rank). Every member
// of a group makes the same calls in the same order and so derives the same readers
// without communicating. Tensors whose layouts give the same members share one entry
// (one load account). For a device-matrix layout over a contiguous group the entry is
// found by a key of O(axes) numbers, so the member list is built once per distinct key,
// not per tensor; a pick costs O(log group).
class ReplicaGroups {
 public:
  explicit ReplicaGroups(int rank) : rank_(rank) {}
  // The entry of this rank's group in `layout` (precondition: the rank is a member).
  int group_of(const TensorLayout& layout);
  // Its members: global ranks, ascending, this rank included.
  const std::vector<int>& members(int group) const { return members_[static_cast<std::size_t>(group)]; }
  // The member that reads the next box of `bytes` (> 0) bytes that the group needs.
  int pick_reader(int group, uint64_t bytes);

 private:
  int rank_;
  std::map<std::vector<int64_t>, int> by_key_;  // contiguous device-matrix groups
  std::map<std::vector<int>, int> by_members_;  // the others, by member list
  std::vector<std::vector<int>> members_;
  std::vector<std::set<std::pair<uint64_t, int>>> load_;  // per group: (bytes so far, rank) of members used
  std::vector<std::size_t> unused_;                       // per group: members [unused_, end) read nothing yet
  int add(std::vector<int> members);
  int by_members(std::vector<int> members);
};

// One query without keeping the lookup.
std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered);

}  // namespace distckpt::internal_plan
