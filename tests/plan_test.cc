#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "plan/load_plan.h"
#include "plan/save_plan.h"
#include "plan/simulate.h"

namespace distckpt::internal_plan {
namespace {

using Tensors = std::vector<std::pair<std::string, TensorLayout>>;

// What rank 0 plans from (it borrows the layouts: keep `tensors` alive).
std::vector<PlannedTensor> planned(const Tensors& tensors, DType dtype = DType::kFloat32) {
  std::vector<PlannedTensor> out;
  for (const auto& [name, layout] : tensors) out.push_back(PlannedTensor{name, dtype, &layout});
  return out;
}

// The state-dict description rank `rank` would send.
std::string description(int rank, const Tensors& tensors, DType dtype = DType::kFloat32) {
  static char dummy[1];
  StateDict sd(rank);
  for (const auto& [name, layout] : tensors) {
    std::vector<void*> bufs(layout.boxes_of(rank).size(), dummy);
    EXPECT_TRUE(sd.add_tensor(name, dtype, bufs, layout).ok());
  }
  return describe_state(sd);
}

TensorLayout dm(const Shape& shape, const Shape& dev, const Shape& map) {
  return *TensorLayout::from_device_matrix(shape, dev, map);
}

TEST(SavePlanTest, ReplicasAreWrittenOnce) {
  // DP2 x TP2: a row-split weight (2 unique slices, 2 holders each) and a bias
  // replicated on all 4 ranks.
  const Tensors tensors{{"w", dm({8, 4}, {2, 2}, {0, -1})}, {"b", dm({4}, {2, 2}, {-1})}};
  auto plan = plan_save(planned(tensors), 4, /*remove_redundancy=*/true);
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
  Tensors tensors;
  for (int i = 0; i < 16; ++i) tensors.push_back({"t" + std::to_string(i), dm({256}, {4}, {-1})});
  auto plan = plan_save(planned(tensors), 4, true);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes_per_rank, (std::vector<uint64_t>(4, 4 * 1024)));
  // Largest first: 1 big + 3 small on 2 ranks -> big alone on one, smalls spread.
  const Tensors mixed_tensors{{"big", dm({300}, {2}, {-1})},
                             {"s1", dm({100}, {2}, {-1})},
                             {"s2", dm({100}, {2}, {-1})},
                             {"s3", dm({100}, {2}, {-1})}};
  auto mixed = plan_save(planned(mixed_tensors), 2, true);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->bytes_per_rank, (std::vector<uint64_t>{1200, 1200}));
}

TEST(SavePlanTest, IsDeterministic) {
  const Tensors tensors{{"w", dm({8, 4}, {2, 2}, {0, -1})}, {"b", dm({4}, {2, 2}, {-1})}};
  auto a = plan_save(planned(tensors), 4, true);
  auto b = plan_save(planned(tensors), 4, true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->index.SerializeAsString(), b->index.SerializeAsString());
  EXPECT_EQ(a->writes, b->writes);
}

TEST(SavePlanTest, WithoutRedundancyRemovalEveryHolderWrites) {
  const Tensors tensors{{"b", dm({4}, {4}, {-1})}};
  auto plan = plan_save(planned(tensors), 4, false);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->index.tensors(0).chunks_size(), 4);
  EXPECT_EQ(plan->bytes_per_rank, (std::vector<uint64_t>(4, 16)));
}

// Each writer's chunks follow one another, each at the next multiple of 64 bytes (the
// kernel copies out of a memory file system fastest into 64-byte aligned buffers from
// 64-byte aligned offsets); the file ends where its last chunk does.
TEST(SavePlanTest, FileOffsetsAreAlignedPerWriter) {
  const Tensors tensors{{"a", dm({10}, {1}, {-1})}, {"b", dm({6}, {1}, {-1})}, {"c", dm({8}, {1}, {-1})}};
  auto plan = plan_save(planned(tensors, DType::kFloat64), 1, true);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->writes[0].size(), 3u);
  EXPECT_EQ(plan->writes[0][0].byte_offset, 0u);
  EXPECT_EQ(plan->writes[0][1].byte_offset, 128u);  // a: 80 bytes
  EXPECT_EQ(plan->writes[0][2].byte_offset, 192u);  // b: 48 bytes
  EXPECT_EQ(plan->index.files(0).size(), 256u);     // c: 64 bytes, no gap after it
  EXPECT_EQ(plan->bytes_per_rank[0], 192u);         // chunk bytes, gaps aside
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(plan->index.tensors(static_cast<int>(i)).chunks(0).byte_offset(), plan->writes[0][i].byte_offset);
}

TEST(SavePlanTest, InconsistentRanksAreExplained) {
  const Tensors w{{"w", dm({8}, {2}, {0})}};
  EXPECT_TRUE(explain_mismatch(description(0, w), description(1, w), 1).ok());
  EXPECT_EQ(*fingerprint(description(0, w)), *fingerprint(description(1, w)));  // same layouts, other rank

  const Tensors v{{"v", dm({8}, {2}, {0})}};
  EXPECT_NE(*fingerprint(description(0, w)), *fingerprint(description(1, v)));
  Status other = explain_mismatch(description(0, w), description(1, v), 1);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("rank 1"), std::string::npos) << other.message();
  EXPECT_NE(explain_mismatch(description(0, w), description(1, w, DType::kInt32), 1).message().find("dtype"),
            std::string::npos);
  const Tensors wx{{"w", dm({8}, {2}, {0})}, {"x", dm({8}, {2}, {0})}};
  EXPECT_NE(explain_mismatch(description(0, wx), description(1, w), 1).message().find("missing"), std::string::npos);
  const Tensors shape{{"w", dm({16}, {2}, {0})}};
  EXPECT_NE(explain_mismatch(description(0, w), description(1, shape), 1).message().find("global shape"),
            std::string::npos);
  const Tensors layout{{"w", dm({8}, {2}, {-1})}};
  EXPECT_NE(explain_mismatch(description(0, w), description(1, layout), 1).message().find("layout differs"),
            std::string::npos);
  EXPECT_FALSE(explain_mismatch(description(0, w), "not a description", 1).ok());
}

TEST(SavePlanTest, LayoutLargerThanTheWorldIsRejected) {
  // dev_mat [2,4] names 8 ranks; only 4 take part: rows 16-31 would never be written.
  const Tensors tensors{{"w", dm({32, 16}, {2, 4}, {1, -1})}};
  auto plan = plan_save(planned(tensors), 4, true);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("names rank 4 but the communicator has 4 ranks"), std::string::npos)
      << plan.status().message();
}

TEST(SavePlanTest, DifferentExplicitBoxesAreExplained) {
  // Rank 0 and rank 1 built different explicit layouts: [0:16] and [8:24] of [32].
  const Tensors a{{"t", *TensorLayout::from_boxes({32}, {{Box{{0}, {16}}}, {Box{{16}, {16}}}})}};
  const Tensors b{{"t", *TensorLayout::from_boxes({32}, {{Box{{0}, {8}}}, {Box{{8}, {24}}}})}};
  EXPECT_NE(*fingerprint(description(0, a)), *fingerprint(description(1, b)));
  Status st = explain_mismatch(description(0, a), description(1, b), 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("explicit boxes differ"), std::string::npos) << st.message();
}

// The planner derives every rank's boxes from the layouts. Checked against the
// definition: every distinct non-empty box of every member is written exactly once, by
// a member holding it, and the plan's bytes are the unique bytes.
TEST(SavePlanTest, EveryDistinctBoxIsWrittenOnceByAHolder) {
  std::vector<int> stage(8), permuted(8);
  std::iota(stage.begin(), stage.end(), 8);
  for (int i = 0; i < 8; ++i) permuted[i] = (i * 3) % 8;
  const Tensors tensors{
      {"col", dm({16, 8}, {2, 4}, {0, -1})},
      {"row_stage", *TensorLayout::from_device_matrix({16, 8}, {2, 4}, {-1, 0}, stage)},
      {"grid_perm", *TensorLayout::from_device_matrix({16, 8}, {2, 4}, {1, 0}, permuted)},
      {"replicated_stage", *TensorLayout::from_device_matrix({5}, {4, 2}, {-1}, stage)},
      {"explicit", *TensorLayout::from_boxes({10}, {{Box{{0}, {3}}}, {Box{{3}, {7}}}, {Box{{0}, {3}}}}, {2, 9, 5})}};
  const int world = 16;
  auto plan = plan_save(planned(tensors), world, true);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  uint64_t unique = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorLayout& l = tensors[t].second;
    std::set<Box> distinct;
    for (int r : l.ranks())
      for (const Box& b : l.boxes_of(r))
        if (!b.empty()) distinct.insert(b);
    const proto::Tensor& stored = plan->index.tensors(static_cast<int>(t));
    ASSERT_EQ(stored.chunks_size(), static_cast<int>(distinct.size())) << tensors[t].first;
    for (const auto& c : stored.chunks()) {
      const Box box = chunk_box(c);
      EXPECT_EQ(distinct.erase(box), 1u) << tensors[t].first << " " << box.to_string();
      const auto held = l.boxes_of(c.writer_rank());
      EXPECT_NE(std::find(held.begin(), held.end(), box), held.end()) << tensors[t].first;
      unique += c.length();
    }
  }
  uint64_t written = 0;
  for (uint64_t b : plan->bytes_per_rank) written += b;
  EXPECT_EQ(written, unique);
  EXPECT_EQ(unique, (16 * 8 * 3 + 5 + 10) * 4u);
  // Compact rank lists: contiguous device-matrix groups are stored as their first rank.
  EXPECT_EQ(plan->index.tensors(1).layout().ranks_size(), 0);
  EXPECT_EQ(plan->index.tensors(1).layout().ranks_first(), 8);
  EXPECT_EQ(plan->index.tensors(2).layout().ranks_size(), 8);
  EXPECT_EQ(plan->index.tensors(4).layout().ranks_size(), 3);
}

TEST(SavePlanTest, WriteListsRoundTrip) {
  std::vector<WriteItem> items{{1, 0, 2, 100, 40}, {3, 1, 0, 140, 8}};
  auto decoded = decode_writes(encode_writes(items));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, items);
  EXPECT_FALSE(decode_writes("abc").ok());
}

TEST(LoadPlanTest, ExactMatchIsOneWholeRead) {
  const Tensors tensors{{"w", dm({8, 4}, {2, 2}, {0, -1})}};
  auto plan = plan_save(planned(tensors), 4, true);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{4, 0}, {4, 4}}, &covered);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_TRUE(reads[0].whole);
  EXPECT_EQ(covered, 16);
}

TEST(LoadPlanTest, ReshardIntersectsChunks) {
  // Stored as 2 row slabs; needed: a column split crossing both.
  const Tensors tensors{{"w", dm({8, 4}, {2}, {0, -1})}};
  auto plan = plan_save(planned(tensors), 2, true);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{0, 2}, {8, 2}}, &covered);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(covered, 16);
  EXPECT_FALSE(reads[0].whole);
  EXPECT_EQ(reads[0].region, (Box{{0, 2}, {4, 2}}));
}

TEST(LoadPlanTest, DuplicateChunksUsedOnce) {
  const Tensors tensors{{"b", dm({6}, {3}, {-1})}};
  auto plan = plan_save(planned(tensors), 3, false);
  ASSERT_TRUE(plan.ok());
  int64_t covered = 0;
  auto reads = plan_reads(plan->index.tensors(0), Box{{1}, {4}}, &covered);
  EXPECT_EQ(reads.size(), 1u);
  EXPECT_EQ(covered, 4);
}

// The lookup visits only candidate chunks; its answers must equal a scan of every
// chunk (exact match first, else every overlap, identical boxes once), for slab, grid
// and duplicated (no redundancy removal) chunks and arbitrary needed boxes.
TEST(LoadPlanTest, LookupEqualsAFullScan) {
  auto scan = [](const proto::Tensor& t, const Box& needed, int64_t* covered) {
    std::vector<ReadItem> reads;
    *covered = 0;
    for (int c = 0; c < t.chunks_size(); ++c)
      if (chunk_box(t.chunks(c)) == needed) {
        *covered = needed.num_elements();
        return std::vector<ReadItem>{ReadItem{c, needed, true}};
      }
    std::set<Box> seen;
    for (int c = 0; c < t.chunks_size(); ++c) {
      const Box box = chunk_box(t.chunks(c));
      Box region = intersect(box, needed);
      if (region.empty() || !seen.insert(box).second) continue;
      *covered += region.num_elements();
      reads.push_back(ReadItem{c, region, false});
    }
    return reads;
  };
  const Tensors tensors{{"slab", dm({64, 12}, {8}, {0, -1})},
                        {"grid", dm({24, 36}, {3, 4, 2}, {2, 0})},
                        {"dup", dm({24, 36}, {3, 4, 2}, {1, -1})},
                        {"uneven", *TensorLayout::from_boxes({40, 6}, {{Box{{0, 0}, {7, 6}}, Box{{7, 0}, {20, 3}}},
                                                                       {Box{{7, 3}, {20, 3}}, Box{{27, 0}, {13, 6}}}})},
                        {"vector", dm({48}, {6, 4}, {1})},
                        {"cube", dm({6, 8, 12}, {2, 3, 4}, {2, 0, 1})},
                        {"scalar", dm({}, {24}, {})},
                        {"empty", dm({0, 8}, {3, 8}, {1, 0})},
                        {"with_empty_box", *TensorLayout::from_boxes({10}, {{Box{{0}, {10}}, Box{{4}, {0}}}, {}})}};
  std::mt19937 rng(7);
  for (bool dedupe : {true, false}) {
    auto plan = plan_save(planned(tensors), 24, dedupe);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    for (int t = 0; t < plan->index.tensors_size(); ++t) {
      const proto::Tensor& stored = plan->index.tensors(t);
      const ChunkLookup lookup(stored);
      std::vector<Box> queries;
      for (const auto& c : stored.chunks()) queries.push_back(chunk_box(c));  // exact matches
      const int dims = stored.global_shape_size();
      for (int q = 0; q < 200; ++q) {
        Box b{Shape(static_cast<std::size_t>(dims)), Shape(static_cast<std::size_t>(dims))};
        for (int d = 0; d < dims; ++d) {
          const int64_t g = stored.global_shape(d);
          b.offset[d] = g == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, g - 1)(rng);
          b.shape[d] = g == 0 ? 0 : std::uniform_int_distribution<int64_t>(1, g - b.offset[d])(rng);
        }
        queries.push_back(b);
      }
      for (const Box& q : queries) {
        int64_t got_covered = -1, want_covered = -1;
        const auto got = lookup.plan_reads(q, &got_covered);
        const auto want = scan(stored, q, &want_covered);
        if (q.empty()) {  // callers skip empty boxes; the lookup plans nothing for them
          EXPECT_TRUE(got.empty());
          continue;
        }
        EXPECT_EQ(got_covered, want_covered) << stored.name() << " " << q.to_string();
        EXPECT_EQ(got_covered, q.num_elements()) << stored.name() << " " << q.to_string();
        ASSERT_EQ(got.size(), want.size()) << stored.name() << " " << q.to_string();
        for (std::size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].chunk, want[i].chunk);
          EXPECT_EQ(got[i].region, want[i].region);
          EXPECT_EQ(got[i].whole, want[i].whole);
        }
      }
    }
  }
}

// Readers of shared boxes: each member of a group reads one stretch of the group's boxes
// in storage order (file, offset), the stretches in member order and of about equal
// bytes (each within one box of an equal share); every member derives the same readers;
// tensors whose layouts give the same group share one division.
TEST(LoadPlanTest, ReplicaReadersTakeStretchesInStorageOrderAndAgree) {
  std::vector<int> stage(8);
  std::iota(stage.begin(), stage.end(), 4);
  const Tensors tensors{{"col", *TensorLayout::from_device_matrix({8, 4}, {4, 2}, {0, -1}, stage)},
                        {"bias", *TensorLayout::from_device_matrix({8}, {4, 2}, {0}, stage)},
                        {"norm", *TensorLayout::from_device_matrix({4}, {4, 2}, {-1}, stage)},
                        {"perm", *TensorLayout::from_device_matrix({8}, {4, 2}, {0}, {11, 9, 7, 5, 10, 8, 6, 4})},
                        // The same members as "norm" through another dev_mat and a permuted list.
                        {"flat", *TensorLayout::from_device_matrix({4}, {8}, {-1}, stage)},
                        {"norm_perm", *TensorLayout::from_device_matrix({4}, {8}, {-1}, {11, 9, 7, 5, 10, 8, 6, 4})}};
  std::mt19937 rng(3);
  struct Box {
    int tensor;
    uint32_t file;
    uint64_t offset, bytes;
  };
  std::vector<Box> boxes;
  for (int i = 0; i < 200; ++i)
    boxes.push_back({std::uniform_int_distribution<int>(0, 5)(rng), std::uniform_int_distribution<uint32_t>(0, 3)(rng),
                     std::uniform_int_distribution<uint64_t>(0, 1 << 20)(rng),
                     std::uniform_int_distribution<uint64_t>(1, 9000)(rng)});
  std::map<int, std::vector<int>> reader_of;  // rank -> the reader of each box
  for (int rank = 4; rank < 12; ++rank) {
    ReplicaGroups groups(rank);
    std::vector<int> numbers;
    std::map<std::vector<int>, std::vector<std::size_t>> by_members;  // boxes of each member list
    for (std::size_t i = 0; i < boxes.size(); ++i) {
      const TensorLayout& l = tensors[static_cast<std::size_t>(boxes[i].tensor)].second;
      const int g = groups.group_of(l);
      EXPECT_EQ(groups.members(g), l.replica_group(rank));
      by_members[groups.members(g)].push_back(i);
      numbers.push_back(groups.need(g, boxes[i].file, boxes[i].offset, boxes[i].bytes));
    }
    groups.assign();
    for (int n : numbers) reader_of[rank].push_back(groups.reader(n));
    for (auto& [members, mine] : by_members) {
      std::stable_sort(mine.begin(), mine.end(), [&](std::size_t x, std::size_t y) {
        return std::tie(boxes[x].file, boxes[x].offset) < std::tie(boxes[y].file, boxes[y].offset);
      });
      uint64_t total = 0, largest = 0;
      for (std::size_t i : mine) total += boxes[i].bytes, largest = std::max(largest, boxes[i].bytes);
      std::map<int, uint64_t> read;
      std::size_t at = 0;  // the reader's place in `members`: never goes back in storage order
      for (std::size_t i : mine) {
        const int reader = reader_of[rank][i];
        const auto place = static_cast<std::size_t>(std::find(members.begin(), members.end(), reader) - members.begin());
        ASSERT_LT(place, members.size()) << "rank " << rank << " box " << i;
        EXPECT_GE(place, at) << "rank " << rank << " box " << i;
        at = place;
        read[reader] += boxes[i].bytes;
      }
      for (int m : members) {
        const double share = static_cast<double>(total) / static_cast<double>(members.size());
        EXPECT_NEAR(static_cast<double>(read[m]), share, static_cast<double>(largest)) << "rank " << rank << " member " << m;
      }
    }
  }
  // Every member of a box's group names the same reader, without communicating.
  for (std::size_t i = 0; i < boxes.size(); ++i)
    for (int rank = 4; rank < 12; ++rank)
      for (int member : tensors[static_cast<std::size_t>(boxes[i].tensor)].second.replica_group(rank))
        EXPECT_EQ(reader_of[member][i], reader_of[rank][i]) << "box " << i << " ranks " << rank << ", " << member;
}

TEST(SimulationTest, PlansASaveAndAReshardThatCoverEveryBox) {
  SimulationConfig c;
  c.ranks = 256;
  c.tensors = 120;
  c.hidden = 256;
  c.save = {0, 8, 4};
  c.load_ranks = 96;
  c.load = {0, 4, 3};
  auto r = simulate_planning(c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->save_dp, 8);
  EXPECT_EQ(r->load_dp, 8);
  // 20 layers of qkv, proj, fc1, fc1 bias, fc2 (8 slices each under TP8) and a norm (1).
  EXPECT_EQ(r->chunks, 20u * (5 * 8 + 1));
  EXPECT_EQ(r->state_bytes, 20u * (3 + 1 + 4 + 4) * 256 * 256 * 2 + 20u * (4 * 256 + 256) * 2);
  EXPECT_EQ(r->bytes_needed, r->bytes_needed_expected);
  EXPECT_GT(r->index_bytes, 0u);
  // Whole slices to holders: the busiest writer within 10% of the best possible.
  EXPECT_GE(r->writer_balance, 1.0);
  EXPECT_LE(r->writer_balance, 1.1);
  EXPECT_EQ(r->files, 256u);  // more slices (820) than ranks: everyone writes
  // Other world sizes and layouts that are not dp x tp x pp are refused.
  c.load_ranks = 100;
  EXPECT_EQ(simulate_planning(c).status().code(), StatusCode::kInvalidArgument);
  c.load_ranks = 0;
  c.hidden = 250;  // not divisible by TP 8
  EXPECT_EQ(simulate_planning(c).status().code(), StatusCode::kInvalidArgument);
  c.hidden = 256;
  c.tensors = 6;  // one layer for four stages
  EXPECT_EQ(simulate_planning(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace distckpt::internal_plan
