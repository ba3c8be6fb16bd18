// The benchmark workload of /work/shared/bench/WORKLOAD.md: a deterministic synthetic
// model state (parameters + Adam moments, float32) whose every value is a pure function
// of (seed, tensor id, global element index).
//
// All functions are local, thread-safe and allocate only what they return.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/layout.h"
#include "distckpt/status.h"

namespace distckpt::bench {

inline constexpr int64_t kHid = 4096;
inline constexpr int64_t kFfn = 1024;
inline constexpr int64_t kLarge = kHid * kHid;
inline constexpr int64_t kMedium = kFfn * kHid;
inline constexpr int64_t kGroups = 64;
inline constexpr int64_t kSmall = kGroups * (2 * kHid + 2 * kFfn);  // 655,360 elements

// "256M", "1G", "64K", "12345" (K/M/G are powers of 1024, case-insensitive; an optional
// trailing "B" or "iB" is accepted). kInvalidArgument on anything else or on overflow.
Result<uint64_t> parse_size(std::string text);

struct WorkloadTensor {
  std::string name;
  int tid = 0;        // position in the full list (the value generator's tensor id)
  Shape shape;        // [rows, cols] or [n]
  int split_dim = -1;  // 0 or 1 for 2-D tensors, -1 for 1-D (never split)

  int64_t num_elements() const;
};

// The full tensor list for a target size of `size_bytes` bytes: parameters, then
// optim.exp_avg.<name>, then optim.exp_avg_sq.<name>. kInvalidArgument when
// size_bytes / 12 < kSmall.
Result<std::vector<WorkloadTensor>> workload_tensors(uint64_t size_bytes);

// Sum over tensors of global size x 4 bytes.
uint64_t workload_bytes(const std::vector<WorkloadTensor>& tensors);

// value(seed, tid, i) of WORKLOAD.md; in [-1, 1), exact in float32.
float workload_value(uint64_t seed, int tid, uint64_t i);

// Layout of `t` on dp x tp ranks (rank = dp_index * tp + tp_index): device matrix
// [dp, tp] with tensor_map [0,-1] / [-1,0] / [-1]; explicit per-rank boxes (one box per
// rank, part i = [i*d/tp, (i+1)*d/tp)) when tp does not divide the split dimension.
// kInvalidArgument when dp or tp < 1, or from the layout constructors.
Result<TensorLayout> workload_layout(const WorkloadTensor& t, int dp, int tp);

// Writes the values of `box` of tensor `t`, row-major over the box, into `out`
// (box.num_elements() floats). Precondition: the box lies inside t.shape.
void fill_slice(uint64_t seed, const WorkloadTensor& t, const Box& box, float* out);

// Number of elements of `data` (row-major over `box`) that are not bitwise equal to the
// workload's values. Same precondition as fill_slice.
uint64_t check_slice(uint64_t seed, const WorkloadTensor& t, const Box& box, const float* data);

}  // namespace distckpt::bench
