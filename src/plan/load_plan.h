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

// The reads that fill `needed` from `tensor`'s chunks. Identical stored boxes (saves
// without redundancy removal) are used once. Sets *covered to the number of needed
// elements the reads provide (== needed.num_elements() when the checkpoint covers it).
std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered);

Box chunk_box(const proto::Chunk& chunk);

}  // namespace distckpt::internal_plan
