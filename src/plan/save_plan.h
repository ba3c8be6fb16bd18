// Save planning: metadata only, no tensor bytes.
//
// Each rank describes what it holds (describe_local_state); rank 0 gathers the
// descriptions and plan_save() removes replicas, balances the writing and lays out
// the data files. The result is the index (checksums filled in after the write) and,
// per rank, the list of chunks that rank writes.
#pragma once

#include <vector>

#include "distckpt/state_dict.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_plan {

// One chunk a rank writes: its local box `local_box` of tensor `tensor` goes to
// `byte_offset` of the rank's data file; it becomes chunk `chunk` of that tensor in
// the index.
struct WriteItem {
  uint32_t tensor = 0;
  uint32_t local_box = 0;
  uint32_t chunk = 0;
  uint64_t byte_offset = 0;
  uint64_t length = 0;
  friend bool operator==(const WriteItem&, const WriteItem&) = default;
};

struct SavePlan {
  proto::Index index;                          // chunks carry crc32c = 0 until the write
  std::vector<std::vector<WriteItem>> writes;  // per rank, in file order
  std::vector<uint64_t> bytes_per_rank;
};

// The rank's tensors as an Index skeleton: name, dtype, global shape, layout, and one
// chunk (offset + shape only) per box the rank holds, in state-dict order.
proto::Index describe_local_state(const StateDict& state);

// Plans a save from every rank's description (index = rank). With remove_redundancy,
// each distinct box is written once, by one of its holders, chosen greedily and
// deterministically: slices with the fewest holders first, then the largest, each to
// the holder with the least bytes so far (ties: lowest rank). Without it, every
// holder writes its own copy. Fails with kInvalidArgument when ranks disagree on a
// tensor's presence, order, dtype, global shape or layout.
Result<SavePlan> plan_save(const std::vector<proto::Index>& ranks, bool remove_redundancy);

std::string encode_writes(const std::vector<WriteItem>& items);
Result<std::vector<WriteItem>> decode_writes(const std::string& bytes);

}  // namespace distckpt::internal_plan
