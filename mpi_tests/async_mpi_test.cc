// Async save under mpirun: round trip, a failure in one rank's background writer
// reaching every rank, back-to-back saves, end() and destruction with a save in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "distckpt/distckpt.h"
#include "mpi_test_util.h"
#include "storage/fault_fs.h"

namespace distckpt {
namespace {

using testing::SharedTempDir;
using testing::world_rank;
using testing::world_size;

struct Model {
  std::vector<double> w;
  std::vector<int32_t> step;
  StateDict state{world_rank()};
  explicit Model(double base) {
    const int tp = world_size() % 2 == 0 ? 2 : 1;
    const int dp = world_size() / tp;
    auto wl = TensorLayout::from_device_matrix({128, 64}, {dp, tp}, {-1, 0});
    auto sl = TensorLayout::from_device_matrix({1}, {dp, tp}, {-1});
    const Box box = wl->slice_box(world_rank());
    w.resize(static_cast<std::size_t>(box.num_elements()));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = base + static_cast<double>(i % 1000) + box.offset[1];
    step = {static_cast<int32_t>(base)};
    EXPECT_TRUE(state.add_tensor("w", DType::kFloat64, w.data(), *wl).ok());
    EXPECT_TRUE(state.add_tensor("step", DType::kInt32, step.data(), *sl).ok());
  }
};

AsyncOptions small_staging() {
  AsyncOptions o;
  o.staging_bytes = 4 << 20;
  o.slab_bytes = 1 << 20;
  return o;
}

SaveOptions named(const std::string& name) {
  SaveOptions o;
  o.name = name;
  return o;
}

void expect_loads(const std::string& path, double base) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  Model got(-1), expected(base);
  auto r = load(*comm, got.state, path, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(got.w, expected.w);
  EXPECT_EQ(got.step, expected.step);
}

TEST(AsyncMpiTest, RoundTripWhileTheLoopMovesOn) {
  SharedTempDir tmp;
  auto ckpt = make_async_checkpointer(MPI_COMM_WORLD, small_staging());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  Model m(10);
  ASSERT_TRUE((*ckpt)->save_async(m.state, tmp.path(), named("a")).ok());
  // The loop keeps computing and communicating on its own communicator meanwhile.
  std::fill(m.w.begin(), m.w.end(), -1.0);
  double sum = 0, one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, world_size());
  auto r = (*ckpt)->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->bytes_written, r->bytes_unique);
  expect_loads(tmp.path() + "/a", 10);
}

TEST(AsyncMpiTest, BackgroundFailureReachesEveryRank) {
  SharedTempDir tmp;
  auto ckpt = make_async_checkpointer(MPI_COMM_WORLD, small_staging());
  ASSERT_TRUE(ckpt.ok());
  Model m(20);
  ASSERT_TRUE((*ckpt)->save_async(m.state, tmp.path(), named("good")).ok());
  ASSERT_TRUE((*ckpt)->wait().ok());
  SaveOptions bad = named("bad");
  if (world_rank() == 0) {  // rank 0 always writes part of 'w'
    internal_storage::FaultSpec spec;
    spec.write_budget = 0;
    spec.budget_path_contains = "data-";
    bad.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  }
  ASSERT_TRUE((*ckpt)->save_async(m.state, tmp.path(), bad).ok());
  auto r = (*ckpt)->wait();
  ASSERT_FALSE(r.ok());
  testing::expect_same_on_all_ranks(r.status().to_string());
  EXPECT_NE(r.status().message().find("No space left"), std::string::npos) << r.status().to_string();
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/bad"));
  expect_loads(tmp.path(), 20);  // the root resolves to the previous checkpoint
}

TEST(AsyncMpiTest, BackToBackSavesAndEndWithASaveInFlight) {
  SharedTempDir tmp;
  auto ckpt = make_async_checkpointer(MPI_COMM_WORLD, small_staging());
  ASSERT_TRUE(ckpt.ok());
  for (int i = 1; i <= 3; ++i) {
    Model m(i);
    ASSERT_TRUE((*ckpt)->save_async(m.state, tmp.path(), named("s" + std::to_string(i))).ok());
  }
  ASSERT_TRUE((*ckpt)->end().ok());
  for (int i = 1; i <= 3; ++i) expect_loads(tmp.path() + "/s" + std::to_string(i), i);
  {
    auto last = make_async_checkpointer(MPI_COMM_WORLD, small_staging());
    ASSERT_TRUE(last.ok());
    Model m(4);
    ASSERT_TRUE((*last)->save_async(m.state, tmp.path(), named("s4")).ok());
  }  // destroyed in flight: completes the save
  expect_loads(tmp.path(), 4);
}

}  // namespace
}  // namespace distckpt
