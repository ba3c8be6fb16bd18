// A small model for format tests: every dtype under DP x TP layouts with row and
// column splits, a replicated bias, a 0-d scalar and an irregular explicit-box tensor.
// Every element's bytes are a function of its global index, so a state built for any
// world size holds the same global tensors and can be compared after a reshard.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "distckpt/state_dict.h"

namespace distckpt::testing {

inline unsigned char element_byte(DType dt, int64_t global, std::size_t k, int salt) {
  return dt == DType::kBool ? static_cast<unsigned char>((global + salt) % 2)
                            : static_cast<unsigned char>(global * 7 + salt + static_cast<int64_t>(k) * 13);
}

struct FormatModel {
  std::vector<std::vector<unsigned char>> buffers;
  StateDict state;

  // `irregular`: with the explicit-box tensor, which puts several boxes of one tensor on
  // a rank (a per-rank .ckpt set cannot hold that).
  FormatModel(int rank, int world, bool irregular = true) : state(rank) {
    const int tp = world % 2 == 0 ? 2 : world;
    const int dp = world / tp;
    int t = 0;
    for (DType dt : kAllDTypes) {
      const Shape map = t % 2 == 0 ? Shape{1, -1} : Shape{-1, 1};  // split over dp... and tp
      auto layout = TensorLayout::from_device_matrix({6, 6}, {tp, dp}, map);
      EXPECT_TRUE(layout.ok()) << layout.status().to_string();
      add("layer" + std::to_string(t) + "/w_" + std::string(dtype_name(dt)), dt, *layout, t);
      ++t;
    }
    add("bias", DType::kFloat32, *TensorLayout::from_device_matrix({5}, {dp, tp}, {-1}), 99);
    add("scale", DType::kFloat64, *TensorLayout::from_device_matrix({}, {dp, tp}, {}), 42);
    // Irregular: 6 boxes of a [7, 5] tensor dealt round-robin to the ranks.
    const std::vector<Box> parts = {{{0, 0}, {3, 2}}, {{0, 2}, {3, 3}}, {{3, 0}, {1, 2}},
                                    {{3, 2}, {1, 3}}, {{4, 0}, {3, 2}}, {{4, 2}, {3, 3}}};
    std::vector<std::vector<Box>> members(static_cast<std::size_t>(world));
    for (std::size_t i = 0; i < parts.size(); ++i) members[i % static_cast<std::size_t>(world)].push_back(parts[i]);
    if (irregular) add("irregular", DType::kInt32, *TensorLayout::from_boxes({7, 5}, members), 5);
    add("empty", DType::kFloat32, *TensorLayout::from_device_matrix({0, 4}, {dp, tp}, {-1, -1}), 3);
    EXPECT_TRUE(state.set_info("lr", 0.25).ok());
    EXPECT_TRUE(state.set_info("tag", "hello").ok());
    EXPECT_TRUE(state.set_info("flag", true).ok());
    EXPECT_TRUE(state.set_info("seed", int64_t{1234}).ok());
  }

  void add(const std::string& name, DType dt, const TensorLayout& layout, int salt) {
    const std::size_t item = dtype_size(dt);
    std::vector<void*> ptrs;
    for (const Box& box : layout.boxes_of(state.rank())) {
      // At least one byte, so that an empty box still has a buffer address.
      std::vector<unsigned char> b(std::max<std::size_t>(1, static_cast<std::size_t>(box.num_elements()) * item));
      for (int64_t i = 0; i < box.num_elements(); ++i) {
        int64_t global = 0, rem = i, stride = 1;
        for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
          const int64_t coord = box.offset[d] + rem % box.shape[d];
          rem /= box.shape[d];
          global += coord * stride;
          stride *= layout.global_shape()[d];
        }
        for (std::size_t k = 0; k < item; ++k) b[static_cast<std::size_t>(i) * item + k] = element_byte(dt, global, k, salt);
      }
      buffers.push_back(std::move(b));
      ptrs.push_back(buffers.back().data());
    }
    Status st = ptrs.size() == 1 ? state.add_tensor(name, dt, ptrs[0], layout) : state.add_tensor(name, dt, ptrs, layout);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  void zero() {
    for (auto& b : buffers) std::memset(b.data(), 0, b.size());
  }
};

// The full tensor `name` of a FormatModel, as bytes.
inline std::vector<unsigned char> full_tensor(const std::string& name) {
  FormatModel one(0, 1);
  const int i = one.state.find(name);
  const TensorEntry& e = one.state.tensors()[static_cast<std::size_t>(i)];
  std::vector<unsigned char> out(static_cast<std::size_t>(full_box(e.layout.global_shape()).num_elements()) *
                                 dtype_size(e.dtype));
  for (std::size_t b = 0; b < e.boxes.size(); ++b)
    copy_box(e.buffers[b], e.boxes[b], out.data(), full_box(e.layout.global_shape()), e.boxes[b], dtype_size(e.dtype));
  return out;
}

}  // namespace distckpt::testing
