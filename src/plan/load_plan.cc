#include "plan/load_plan.h"

#include <set>

namespace distckpt::internal_plan {

Box chunk_box(const proto::Chunk& c) {
  return Box{Shape(c.offset().begin(), c.offset().end()), Shape(c.shape().begin(), c.shape().end())};
}

std::vector<ReadItem> plan_reads(const proto::Tensor& tensor, const Box& needed, int64_t* covered) {
  std::vector<ReadItem> reads;
  std::set<Box> seen;
  *covered = 0;
  // An exact match serves the whole box with one read and no copy.
  for (int c = 0; c < tensor.chunks_size(); ++c) {
    if (chunk_box(tensor.chunks(c)) == needed) {
      reads.push_back(ReadItem{c, needed, true});
      *covered = needed.num_elements();
      return reads;
    }
  }
  for (int c = 0; c < tensor.chunks_size(); ++c) {
    Box box = chunk_box(tensor.chunks(c));
    Box region = intersect(box, needed);
    if (region.empty() || !seen.insert(box).second) continue;
    *covered += region.num_elements();
    reads.push_back(ReadItem{c, std::move(region), false});
  }
  return reads;
}

}  // namespace distckpt::internal_plan
