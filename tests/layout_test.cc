#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "distckpt/layout.h"
#include "distckpt/state_dict.h"

namespace distckpt {
namespace {

TensorLayout make(const Shape& shape, const Shape& dev_mat, const Shape& map, std::vector<int> ranks = {}) {
  auto l = TensorLayout::from_device_matrix(shape, dev_mat, map, std::move(ranks));
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return *l;
}

// docs/design.md, worked example 1: shape [32,16], dev_mat [2,4], tensor_map [1,-1].
TEST(LayoutTest, RowSplitOverFirstAxis) {
  TensorLayout l = make({32, 16}, {2, 4}, {1, -1});
  for (int r = 0; r < 8; ++r) {
    const Box b = l.slice_box(r);
    EXPECT_EQ(b.offset, (Shape{r < 4 ? 0 : 16, 0})) << r;
    EXPECT_EQ(b.shape, (Shape{16, 16}));
    EXPECT_EQ(l.slice_index(r), r < 4 ? 0 : 1);
  }
  EXPECT_EQ(l.replica_group(2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(l.replica_group(5), (std::vector<int>{4, 5, 6, 7}));
}

// docs/design.md, worked example 2: tensor_map [0,-1]: rank r holds rows 8*(r%4).
TEST(LayoutTest, RowSplitOverLastAxis) {
  TensorLayout l = make({32, 16}, {2, 4}, {0, -1});
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(l.slice_box(r).offset, (Shape{8 * (r % 4), 0}));
    EXPECT_EQ(l.slice_box(r).shape, (Shape{8, 16}));
    EXPECT_EQ(l.slice_index(r), r % 4);
  }
  EXPECT_EQ(l.replica_group(1), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.replica_group(7), (std::vector<int>{3, 7}));
}

TEST(LayoutTest, TwoDimSplitAndSliceIndex) {
  // dim 0 over axis 0 (size 2), dim 1 over axis 1 (size 4): no replicas.
  TensorLayout l = make({4, 8}, {2, 4}, {1, 0});
  EXPECT_EQ(l.slice_box(6).offset, (Shape{2, 4}));
  EXPECT_EQ(l.slice_box(6).shape, (Shape{2, 2}));
  EXPECT_EQ(l.slice_index(6), 6);
  EXPECT_EQ(l.replica_group(6), (std::vector<int>{6}));
  // Transposed map: dim 0 over the last axis (4 parts), dim 1 over the first (2 parts).
  TensorLayout t = make({8, 4}, {2, 4}, {0, 1});
  EXPECT_EQ(t.slice_box(6).offset, (Shape{4, 2}));  // coords (1,2): row part 2, col part 1
  EXPECT_EQ(t.slice_index(6), 2 * 2 + 1);
}

TEST(LayoutTest, ReplicatedAndScalar) {
  TensorLayout l = make({5}, {4}, {-1});
  EXPECT_EQ(l.slice_box(3), full_box({5}));
  EXPECT_EQ(l.replica_group(3), (std::vector<int>{0, 1, 2, 3}));
  TensorLayout s = make({}, {2}, {});
  EXPECT_EQ(s.slice_box(1).num_elements(), 1);
}

TEST(LayoutTest, RankListMapsGroupToGlobalRanks) {
  TensorLayout l = make({8}, {2}, {0}, {4, 6});
  EXPECT_EQ(l.slice_box(6).offset, (Shape{4}));
  EXPECT_EQ(l.group_index(6), 1);
  EXPECT_EQ(l.group_index(5), -1);
  EXPECT_TRUE(l.boxes_of(5).empty());
  EXPECT_EQ(l.replica_group(4), (std::vector<int>{4}));
}

TEST(LayoutTest, InvalidLayoutsAreRejectedClearly) {
  struct Case {
    Shape shape, dev_mat, map;
    std::vector<int> ranks;
    const char* expect;
  };
  const Case cases[] = {
      {{32, 16}, {2, 4}, {2, -1}, {}, "out of range"},
      {{32, 16}, {2, 4}, {-2, -1}, {}, "out of range"},
      {{32, 16}, {2, 4}, {1, 1}, {}, "twice"},
      {{30, 16}, {2, 4}, {0, -1}, {}, "not divisible"},
      {{32, 16}, {2, 4}, {1, -1}, {0, 1, 2}, "product of dev_mat"},
      {{32, 16}, {2, 4}, {1}, {}, "entries but the tensor has 2 dims"},
      {{32, 16}, {0, 4}, {1, -1}, {}, "non-positive"},
      {{32, -16}, {2, 4}, {1, -1}, {}, "negative"},
      {{32, 16}, {2}, {0, -1}, {1, 1}, "twice"},
  };
  for (const Case& c : cases) {
    auto l = TensorLayout::from_device_matrix(c.shape, c.dev_mat, c.map, c.ranks);
    ASSERT_FALSE(l.ok()) << c.expect;
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find(c.expect), std::string::npos) << l.status().message();
  }
}

TEST(LayoutTest, OverflowingShapesAndUnknownDtypes) {
  auto huge = TensorLayout::from_device_matrix({int64_t{1} << 40, int64_t{1} << 40}, {1}, {-1, -1});
  EXPECT_NE(huge.status().message().find("too many elements"), std::string::npos) << huge.status().message();
  StateDict sd(0);
  float x = 0;
  auto l = TensorLayout::from_device_matrix({1}, {1}, {-1});
  Status st = sd.add_tensor("x", static_cast<DType>(99), &x, *l);
  EXPECT_NE(st.message().find("unknown dtype"), std::string::npos) << st.message();
  EXPECT_NE(sd.add_tensor("x", DType::kFloat32, nullptr, *l).message().find("box(es)"), std::string::npos);
}

// A tensor whose memory moved (a framework reallocating a parameter) gets new buffers;
// the count must match the rank's boxes, and a refused change leaves the entry as it was.
TEST(LayoutTest, SetBuffersFollowsMovedMemory) {
  StateDict sd(1);
  auto l = TensorLayout::from_device_matrix({4, 2}, {2}, {0, -1});
  ASSERT_TRUE(l.ok());
  float before[4] = {}, after[4] = {};
  ASSERT_TRUE(sd.add_tensor("w", DType::kFloat32, before, *l).ok());
  ASSERT_TRUE(sd.set_buffers("w", {after}).ok());
  EXPECT_EQ(sd.tensors()[0].buffers, (std::vector<void*>{after}));
  EXPECT_EQ(sd.set_buffers("w", {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sd.set_buffers("w", {nullptr}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sd.set_buffers("v", {after}).code(), StatusCode::kNotFound);
  EXPECT_EQ(sd.tensors()[0].buffers, (std::vector<void*>{after}));
}

TEST(LayoutTest, ExplicitBoxesIrregular) {
  // 10 rows over 3 ranks: [0,3) [3,6) [6,10).
  auto l = TensorLayout::from_boxes({10, 4}, {{Box{{0, 0}, {3, 4}}}, {Box{{3, 0}, {3, 4}}}, {Box{{6, 0}, {4, 4}}}});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_FALSE(l->is_device_matrix());
  EXPECT_EQ(l->boxes_of(2)[0].shape, (Shape{4, 4}));
  EXPECT_EQ(l->replica_group(1), (std::vector<int>{1}));
  // Replicated explicit boxes: members 0 and 1 identical.
  auto r = TensorLayout::from_boxes({4}, {{Box{{0}, {2}}, Box{{2}, {2}}}, {Box{{0}, {2}}, Box{{2}, {2}}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->replica_group(0), (std::vector<int>{0, 1}));
}

TEST(LayoutTest, ExplicitBoxesInvalid) {
  auto gap = TensorLayout::from_boxes({10}, {{Box{{0}, {3}}}, {Box{{4}, {6}}}});
  EXPECT_NE(gap.status().message().find("cover 9 of the 10"), std::string::npos) << gap.status().message();
  auto overlap = TensorLayout::from_boxes({10}, {{Box{{0}, {6}}}, {Box{{4}, {6}}}});
  EXPECT_NE(overlap.status().message().find("overlap"), std::string::npos);
  auto outside = TensorLayout::from_boxes({10}, {{Box{{0}, {11}}}});
  EXPECT_NE(outside.status().message().find("outside"), std::string::npos);
  auto dims = TensorLayout::from_boxes({10}, {{Box{{0, 0}, {10, 1}}}});
  EXPECT_NE(dims.status().message().find("wrong number of dims"), std::string::npos);
}

// Many boxes: the tiling check must stay near-linear for the splits layouts produce
// (a quadratic check would take minutes here and hit the test timeout).
TEST(LayoutTest, TilingCheckScalesToManyBoxes) {
  const int64_t n = 50000;
  std::vector<std::vector<Box>> columns(1);
  for (int64_t i = 0; i < n; ++i) columns[0].push_back(Box{{0, i}, {1, 1}});
  EXPECT_TRUE(TensorLayout::from_boxes({1, n}, columns).ok());
  std::vector<std::vector<Box>> grid(1);
  for (int64_t r = 0; r < 300; ++r)
    for (int64_t c = 0; c < 300; ++c) grid[0].push_back(Box{{r, c}, {1, 1}});
  EXPECT_TRUE(TensorLayout::from_boxes({300, 300}, grid).ok());
  grid[0].back() = Box{{299, 298}, {1, 1}};  // duplicate of its neighbour: a gap
  EXPECT_FALSE(TensorLayout::from_boxes({300, 300}, grid).ok());
}

// Irregular splits (extents that overlap without being equal on a dim) take the
// pairwise path of the check: a tiling passes, an overlap of equal volume is named.
TEST(LayoutTest, TilingCheckIrregularSplits) {
  const std::vector<std::vector<Box>> tiles = {
      {Box{{0, 0}, {3, 2}}, Box{{0, 2}, {2, 2}}}, {Box{{2, 2}, {2, 2}}, Box{{3, 0}, {1, 2}}}};
  EXPECT_TRUE(TensorLayout::from_boxes({4, 4}, tiles).ok());
  // Same volume (16) but [0:2, 2:4] and [1:3, 2:4] share a row and [3:4, 2:4] is a gap.
  const std::vector<std::vector<Box>> overlapping = {
      {Box{{0, 0}, {3, 2}}, Box{{0, 2}, {2, 2}}}, {Box{{1, 2}, {2, 2}}, Box{{3, 0}, {1, 2}}}};
  auto bad = TensorLayout::from_boxes({4, 4}, overlapping);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[0:2, 2:4] and [1:3, 2:4] overlap"), std::string::npos)
      << bad.status().message();
}

// Columns split at alternating rows ([4, C]: even columns at row 1, odd ones at row 2)
// overlap on dim 0 without being equal: the check must cut on dim 1 (disjoint columns)
// and stay near-linear, where cutting on dim 0 first compares ~C^2 pairs; so must a
// staircase (every column split at its own row). More than 64 dims are refused.
TEST(LayoutTest, TilingCheckChoosesTheCleanDimAndIsBounded) {
  const int64_t c = 20000;
  std::vector<std::vector<Box>> alternating(1);
  for (int64_t col = 0; col < c; ++col) {
    const int64_t cut = col % 2 == 0 ? 1 : 2;
    alternating[0].push_back(Box{{0, col}, {cut, 1}});
    alternating[0].push_back(Box{{cut, col}, {4 - cut, 1}});
  }
  EXPECT_TRUE(TensorLayout::from_boxes({4, c}, alternating).ok());
  alternating[0][3] = Box{{1, 1}, {3, 1}};  // overlaps [0:2, 1:2] by one element, a gap at [3, 1]
  auto bad = TensorLayout::from_boxes({4, c}, alternating);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[0:2, 1:2] and [1:4, 1:2] overlap"), std::string::npos) << bad.status().message();

  const int64_t n = 15000;
  std::vector<std::vector<Box>> staircase(1);
  for (int64_t col = 0; col < n; ++col) {
    staircase[0].push_back(Box{{0, col}, {col + 1, 1}});
    staircase[0].push_back(Box{{col + 1, col}, {n + 1 - (col + 1), 1}});
  }
  EXPECT_TRUE(TensorLayout::from_boxes({n + 1, n}, staircase).ok());  // clean on dim 1: columns

  EXPECT_FALSE(TensorLayout::from_boxes(Shape(65, 1), {{Box{Shape(65, 0), Shape(65, 1)}}}).ok());
  EXPECT_TRUE(TensorLayout::from_boxes(Shape(64, 1), {{Box{Shape(64, 0), Shape(64, 1)}}}).ok());
}

// replica_group and group_index are computed arithmetically (no scan of the group):
// they must equal the definition (members whose slice box is identical) for groups
// given as the identity, a contiguous run (a pipeline stage) and a permutation.
TEST(LayoutTest, ReplicaGroupsMatchTheDefinition) {
  struct Case {
    Shape shape, dev_mat, map;
    std::vector<int> ranks;
  };
  std::vector<int> stage(24), permuted(24);
  std::iota(stage.begin(), stage.end(), 100);
  for (int i = 0; i < 24; ++i) permuted[i] = (i * 7) % 24 + 3;  // 7 is coprime with 24
  const std::vector<Case> cases = {
      {{12, 8}, {2, 3, 4}, {2, 0}, {}},       {{12, 6}, {2, 3, 4}, {-1, 1}, stage},
      {{12, 8}, {2, 3, 4}, {0, 2}, permuted}, {{6}, {2, 3, 4}, {-1}, permuted},
      {{24, 4}, {24}, {0, -1}, stage},        {{12, 8, 6}, {2, 3, 4}, {2, 0, 1}, permuted}};
  for (const Case& c : cases) {
    const TensorLayout l = make(c.shape, c.dev_mat, c.map, c.ranks);
    for (int m = 0; m < l.group_size(); ++m) {
      const int rank = l.ranks()[m];
      EXPECT_EQ(l.group_index(rank), m);
      std::vector<int> expected;
      for (int other : l.ranks())
        if (l.slice_box(other) == l.slice_box(rank)) expected.push_back(other);
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(l.replica_group(rank), expected) << l.to_string() << " rank " << rank;
    }
    EXPECT_EQ(l.group_index(-1), -1);
    EXPECT_EQ(l.group_index(1000), -1);
    EXPECT_EQ(l.max_rank(), *std::max_element(l.ranks().begin(), l.ranks().end()));
    EXPECT_EQ(l.contiguous_first_rank(), c.ranks.empty() ? 0 : (c.ranks == stage ? 100 : -1));
  }
}

TEST(BoxTest, IntersectAndContains) {
  Box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  EXPECT_EQ(intersect(a, b), (Box{{2, 3}, {2, 1}}));
  EXPECT_TRUE(intersect(a, Box{{4, 0}, {1, 1}}).empty());
  EXPECT_TRUE(a.contains(Box{{1, 1}, {2, 2}}));
  EXPECT_FALSE(a.contains(b));
  EXPECT_EQ(a.to_string(), "[0:4, 0:4]");
}

TEST(BoxTest, CopyBoxStrided) {
  // Global 6x5 tensor with value = 100*row + col.
  std::vector<int> global(30);
  for (int i = 0; i < 30; ++i) global[i] = 100 * (i / 5) + i % 5;
  const Box whole{{0, 0}, {6, 5}};
  const Box dst_box{{1, 2}, {4, 3}};
  std::vector<int> dst(12, -1);
  copy_box(global.data(), whole, dst.data(), dst_box, dst_box, sizeof(int));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(dst[r * 3 + c], 100 * (r + 1) + c + 2);
  // Partial region, back into a zeroed global buffer.
  std::vector<int> back(30, 0);
  const Box region{{2, 3}, {2, 2}};
  copy_box(dst.data(), dst_box, back.data(), whole, region, sizeof(int));
  for (int i = 0; i < 30; ++i) {
    const int r = i / 5, c = i % 5;
    const bool in = r >= 2 && r < 4 && c >= 3 && c < 5;
    EXPECT_EQ(back[i], in ? global[i] : 0) << r << "," << c;
  }
  // Whole-row slab: one contiguous run.
  std::vector<int> rows(10);
  copy_box(global.data(), whole, rows.data(), Box{{2, 0}, {2, 5}}, Box{{2, 0}, {2, 5}}, sizeof(int));
  EXPECT_EQ(rows[0], 200);
  EXPECT_EQ(rows[9], 304);
}

}  // namespace
}  // namespace distckpt
