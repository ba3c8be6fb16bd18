#include <gtest/gtest.h>

#include <map>

#include "plan/load_plan.h"
#include "plan/save_plan.h"

namespace distckpt::internal_plan {
namespace {

// The descriptions every rank of a DP x TP job would send for the given tensors.
std::vector<proto::Index> describe(int world, const std::vector<std::pair<std::string, TensorLayout>>& tensors,
                                   DType dtype = DType::kFloat32) {
  std::vector<proto::Index> out;
  static char dummy[1];
  for (int r = 0; r < world; ++r) {
    StateDict sd(r);
    for (const auto& [name, layout] : tensors) {
      std::vector<void*> bufs(layout.boxes_of(r).size(), dummy);
      EXPECT_TRUE(sd.add_tensor(name, dtype, bufs, layout).ok());
    }
    out.push_back(describe_local_state(sd));
  }
  return out;
}

TensorLayout dm(const Shape& shape, const Shape& dev, const Shape& map) {
  return *TensorLayout::from_device_matrix(shape, dev, map);
}

TEST(SavePlanTest, ReplicasAreWrittenOnce) {
  // DP2 x TP2: a row-split weight (2 unique slices, 2 holders each) and a bias
  // replicated on all 4 ranks.
  auto ranks = describe(4, {{"w", dm({8, 4}, {2, 2}, {0, -1})}, {"b", dm({4}, {2, 2}, {-1})}});
  auto plan = plan_save(ranks, /*remove_redundancy=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const proto::Index& index = plan->index;
  ASSERT_EQ(index.tensors_size(), 2);
  EXPECT_EQ(index.tensors(0).chunks_size(), 2);
  EXPECT_EQ(index.tensors(1).chunks_size(), 1);
  uint64_t written = 0;
  for (uint64_t b : plan->bytes_per_rank) written += b;
  EXPECT_EQ(written, (8 * 4 + 4) * 4u);
  // Greedy: the bias (4 holders) goes last, to a rank that wrote nothing yet.
  // w slices (2 holders, 64 B each) go to ranks 0 and 1; the bias to rank 2.
  EXPECT_EQ(plan->bytes_per_rank, (std::vector<uint64_t>{64, 64, 16, 0}));
  EXPECT_EQ(index.files_size(), 3);
  EXPECT_EQ(index.files(0).name(), "data-00000.bin");
}

TEST(SavePlanTest, BalancesBytesAcrossReplicas) {
  // 16 equal slices each held by all 4 ranks: every rank writes 4 of them.
  std::vector<std::pair<std::string, TensorLayout>> tensors;
  for (int i = 0; i < 16; ++i) tensors.push_back({"t" + std::to_string(i), dm({256}, {4}, {-1})});
  auto plan = plan_save(describe(4, tensors), true);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes_per_rank, (std::vector<uint64_t>(4, 4 * 1024)));
  // Largest first: 1 big + 3 small on 2 ranks -> big alone on one, smalls spread.
  auto mixed = plan_save(describe(2, {{"big", dm({300}, {2}, {-1})},
                                      {"s1", dm({100}, {2}, {-1})},
                                      {"s2", dm({100}, {2}, {-1})},
                                      {"s3", dm({100}, {2}, {-1})}}),
                         true);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->bytes_per_rank, (std::vector<uint64_t>{1200, 1200}));
}

TEST(SavePlanTest, IsDeterministic) {
  auto ranks = describe(4, {{"w", dm({8, 4}, {2, 2}, {0, -1})}, {"b", dm({4}, {2, 2}, {-1})}});
  auto a = plan_save(ranks, true);
  auto b = plan_save(ranks, true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->index.SerializeAsString(), b->index.SerializeAsString());
  EXPECT_EQ(a->writes, b->writes);
}

TEST(SavePlanTest, WithoutRedundancyRemovalEveryHolderWrites) {
  auto ranks = describe(4, {{"b", dm({4}, {4}, {-1})}});
  auto plan = plan_save(ranks, false);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->index.tensors(0).chunks_size(), 4);
  EXPECT_EQ(plan->bytes_per_rank, (std::vector<uint64_t>(4, 16)));
}

TEST(SavePlanTest, FileOffsetsArePackedPerWriter) {
  auto ranks = describe(1, {{"a", dm({10}, {1}, {-1})}, {"b", dm({6}, {1}, {-1})}}, DType::kFloat64);
  auto plan = plan_save(ranks, true);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->writes[0].size(), 2u);
  EXPECT_EQ(plan->writes[0][0].byte_offset, 0u);
  EXPECT_EQ(plan->writes[0][1].byte_offset, 80u);
  EXPECT_EQ(plan->index.files(0).size(), 128u);
}

TEST(SavePlanTest, InconsistentRanksAreRejected) {
  auto ranks = describe(2, {{"w", dm({8}, {2}, {0})}});
  auto other = describe(2, {{"v", dm({8}, {2}, {0})}});
  ranks[1] = other[1];
  auto plan = plan_save(ranks, true);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("rank 1"), std::string::npos) << plan.status().message();
  auto dtype = describe(2, {{"w", dm({8}, {2}, {0})}}, DType::kInt32);
  auto base = describe(2, {{"w", dm({8}, {2}, {0})}});
  base[1] = dtype[1];
  EXPECT_NE(plan_save(base, true).status().message().find("dtype"), std::string::npos);
  auto missing = describe(2, {{"w", dm({8}, {2}, {0})}, {"x", dm({8}, {2}, {0})}});
  missing[1] = describe(2, {{"w", dm({8}, {2}, {0})}})[1];
  EXPECT_NE(plan_save(missing, true).status().message().find("missing"), std::string::npos);
}

TEST(SavePlanTest, LayoutLargerThanTheWorldIsRejected) {
  // dev_mat [2,4] names 8 ranks; only 4 take part: rows 16-31 would never be written.
  auto plan = plan_save(describe(4, {{"w", dm({32, 16}, {2, 4}, {1, -1})}}), true);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("names rank 4 but the communicator has 4 ranks"), std::string::npos)
      << plan.status().message();
}

TEST(SavePlanTest, BoxesThatDoNotTileAreRejected) {
  // Rank 0 and rank 1 built different explicit layouts: [0:16] and [8:24] of [32].
  auto a = *TensorLayout::from_boxes({32}, {{Box{{0}, {16}}}, {Box{{16}, {16}}}});
  auto b = *TensorLayout::from_boxes({32}, {{Box{{0}, {8}}}, {Box{{8}, {24}}}});
  auto ranks = describe(2, {{"t", a}});
  ranks[1] = describe(2, {{"t", b}})[1];
  auto plan = plan_save(ranks, true);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("tile"), std::string::npos) << plan.status().message();
}

TEST(SavePlanTest, WriteListsRoundTrip) {
  std::vector<WriteItem> items{{1, 0, 2, 100, 40}, {3, 1, 0, 140, 8}};
  auto decoded = decode_writes(encode_writes(items));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, items);
  EXPECT_FALSE(decode_writes("abc").ok());
}

TEST(LoadPlanTest, ExactMatchIsOneWholeRead) {
  auto plan = plan_save(describe(4, {{"w", dm({8, 4}, {2, 2}, {0, -1})}}), true);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{4, 0}, {4, 4}}, &covered);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_TRUE(reads[0].whole);
  EXPECT_EQ(covered, 16);
}

TEST(LoadPlanTest, ReshardIntersectsChunks) {
  // Stored as 2 row slabs; needed: a column split crossing both.
  auto plan = plan_save(describe(2, {{"w", dm({8, 4}, {2}, {0, -1})}}), true);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{0, 2}, {8, 2}}, &covered);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(covered, 16);
  EXPECT_FALSE(reads[0].whole);
  EXPECT_EQ(reads[0].region, (Box{{0, 2}, {4, 2}}));
}

TEST(LoadPlanTest, DuplicateChunksUsedOnce) {
  auto plan = plan_save(describe(3, {{"b", dm({6}, {3}, {-1})}}), false);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{1}, {4}}, &covered);
  EXPECT_EQ(reads.size(), 1u);
  EXPECT_EQ(covered, 4);
}

}  // namespace
}  // namespace distckpt::internal_plan
