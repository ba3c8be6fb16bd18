// Save planning: metadata only, no tensor bytes.
//
// Ranks first agree that their state dicts describe the same tensors with the same
// layouts (describe_state, compared by fingerprint: O(tensors) bytes per rank, never
// the world's boxes). Rank 0 then plans for everyone from its own layouts, which give
// every rank's boxes: plan_save() removes replicas, balances the writing and lays out
// the data files. The result is the index (checksums filled in after the write) and,
// per rank, the list of chunks that rank writes. Cost: O(ranks x tensors) for
// device-matrix layouts, with no pairwise comparison of ranks or boxes.
#pragma once

#include <string>
#include <vector>

#include "distckpt/state_dict.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

namespace distckpt::internal_plan {

// One chunk a rank writes: its local box `local_box` of tensor `tensor` goes to
// `byte_offset` of the rank's data file; it becomes chunk `chunk` of that tensor in
// the index.
struct WriteItem {
  uint32_t tensor = 0;
  uint32_t local_box = 0;
  uint32_t chunk = 0;
  uint64_t byte_offset = 0;
  uint64_t length = 0;         // bytes of the box
  uint64_t stored_length = 0;  // bytes in the file: `length`, or more when encrypted (CBC padding)
  friend bool operator==(const WriteItem&, const WriteItem&) = default;
};

struct SavePlan {
  proto::Index index;                          // chunks carry crc32c = 0 until the write
  std::vector<std::vector<WriteItem>> writes;  // per rank, in file order
  std::vector<uint64_t> bytes_per_rank;  // chunk bytes each rank writes (its file adds the gaps)
};

// A tensor as the planner sees it. `layout` is borrowed.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  const TensorLayout* layout = nullptr;
};

// The state dict's tensors, borrowing its layouts.
std::vector<PlannedTensor> planned_tensors(const StateDict& state);

// The index entry of a tensor without chunks: name, dtype, global shape, layout (a
// contiguous device-matrix group as ranks_first). With `member_boxes` and an explicit
// layout, one chunk per box of every member (writer_rank = the member), so that two
// descriptions are equal exactly when the layouts are.
void describe_tensor(const PlannedTensor& tensor, bool member_boxes, proto::Tensor* out);

// A rank's state dict as the bytes ranks must agree on before rank 0 plans for all:
// every tensor's describe_tensor(.., member_boxes = true), in order. O(tensors) bytes
// for device-matrix layouts over contiguous groups.
std::string describe_state(const StateDict& state);
std::string describe_tensors(const std::vector<PlannedTensor>& tensors);

// The SHA-256 of a description as kFingerprintWords 64-bit words, for an allreduce
// min/max check. kInternal if OpenSSL fails.
inline constexpr std::size_t kFingerprintWords = 4;
Result<std::vector<int64_t>> fingerprint(const std::string& description);

// The error for rank `other_rank`'s description that differs from rank 0's: names the
// rank, the first tensor that differs and how (presence, order, dtype, shape, layout,
// explicit boxes); OK when they are equal.
Status explain_mismatch(const std::string& rank0, const std::string& other, int other_rank);

// Plans a save by `world` ranks that all hold `tensors` (boxes per rank from the
// layouts). With remove_redundancy, each distinct box is written once, by one of its
// holders, chosen greedily and deterministically: slices with the fewest holders
// first, then the largest, each to the holder with the least bytes so far (ties:
// lowest rank). Without it, every holder writes its own copy. Fails with
// kInvalidArgument when a layout names a rank outside the world or the boxes do not
// tile a tensor.
// With `node_of` (rank -> node) and remove_redundancy, replicas are removed within each
// node only: every node writes one copy of each distinct box its ranks hold (the local
// tier, tier/local_save.h).
//
// Which holder writes a replicated slice (with remove_redundancy):
//   kBalanced:  the greedy balance above.
//   kMindSpore: MindSpore's remove_param_redundancy (mindspore/train/utils.py of the
//               2.x line, with keep_redundancy = 1): the slices whose holders are the same ranks (sorted) form a list
//               in tensor order, and the k-th slice of each list goes to its k-th holder,
//               modulo their count. Per-rank .ckpt sets use it, so that each rank file
//               holds what MindSpore's own save would put there.
enum class WriterChoice { kBalanced, kMindSpore };
Result<SavePlan> plan_save(const std::vector<PlannedTensor>& tensors, int world, bool remove_redundancy,
                           const std::vector<int>* node_of = nullptr, WriterChoice choice = WriterChoice::kBalanced);

// Encrypted saves: gives every chunk its stored length (CBC pads), moves the chunks
// that follow and the files' sizes accordingly, and records each chunk's nonce.
void apply_encryption(const internal_transform::CheckpointCipher& cipher, SavePlan* plan);

std::string encode_writes(const std::vector<WriteItem>& items);
Result<std::vector<WriteItem>> decode_writes(const std::string& bytes);

}  // namespace distckpt::internal_plan
