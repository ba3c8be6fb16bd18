// Load planning: which stored chunks a rank reads for the boxes it needs.
#pragma once

#include <vector>

#include "distckpt/layout.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_plan {

struct ReadItem {
  int chunk = 0;  // index into the tensor's chunks
  Box region;     // intersection of the chunk's box and the needed box
  bool whole = false;  // the chunk's box equals the needed box: read straight into the buffer
};

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

// One query without keeping the lookup.
std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered);

Box chunk_box(const proto::Chunk& chunk);

}  // namespace distckpt::internal_plan
