// CheckpointManager under mpirun: every rank reaches the same decisions (steps,
// seconds measured on rank 0 with a slow rank, retention), and resume restores them.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/manager.h"
#include "distckpt/mpi_comm.h"
#include "format_model.h"
#include "mpi_test_util.h"

namespace distckpt {
namespace {

using testing::FormatModel;
using testing::SharedTempDir;

// Every rank's vector equals rank 0's.
bool same_on_all_ranks(const std::vector<int>& v) {
  std::vector<int> root = v;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
  return testing::all_ranks(root == v);
}

// A fresh manager over zeroed buffers resumes the newest checkpoint of `c`'s series (at
// `step`, when >= 0) and gets the saved values back.
void expect_resumes(Comm& comm, const CheckpointConfig& c, int64_t step) {
  FormatModel fresh(comm.rank(), comm.size()), want(comm.rank(), comm.size());
  fresh.zero();
  auto again = CheckpointManager::create(comm, fresh.state, c);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto resumed = (*again)->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
  EXPECT_TRUE(resumed->resumed);
  EXPECT_EQ((*again)->series_prefix(), c.prefix);
  if (step >= 0) EXPECT_EQ(resumed->step, step);
  for (std::size_t i = 0; i < fresh.buffers.size(); ++i) EXPECT_EQ(fresh.buffers[i], want.buffers[i]);
}

TEST(ManagerMpi, StepsSecondsRetentionAndResumeAgreeOnEveryRank) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  const int world = comm->size();
  SharedTempDir dir;
  FormatModel model(comm->rank(), world);
  CheckpointConfig c;
  c.directory = dir.path();
  c.prefix = "m";
  c.save_every_steps = 0;
  c.save_every_seconds = 0.05;
  c.keep_max = 2;
  auto m = CheckpointManager::create(*comm, model.state, c);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::vector<int> saved;
  for (int64_t step = 1; step <= 15; ++step) {
    // The last rank is slow and uneven; only rank 0's clock decides, for everyone.
    std::this_thread::sleep_for(std::chrono::milliseconds(comm->rank() == world - 1 ? 4 + 5 * (step % 3) : 8));
    auto out = (*m)->step_end(step, 0, {});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    saved.push_back(out->saved ? 1 : 0);
  }
  EXPECT_TRUE(same_on_all_ranks(saved));
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->entries.size(), 2u);  // keep_max, after every save

  expect_resumes(*comm, c, -1);
}

// async_save under mpirun: the manager duplicates MPI_COMM_WORLD for its background
// saves (MPI_THREAD_MULTIPLE, see mpi_gtest_main.cc). Ranks run at different speeds, so
// their background saves finish at different times: still every rank sees the same saves
// started and committed at the same calls, and end() completes the one in flight.
TEST(ManagerMpi, AsyncSavesCommitInTheBackgroundAndResume) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  const int world = comm->size();
  SharedTempDir dir;
  FormatModel model(comm->rank(), world);
  CheckpointConfig c;
  c.directory = dir.path();
  c.prefix = "a";
  c.save_every_steps = 2;
  c.keep_max = 2;
  c.async_save = true;
  c.async.staging_bytes = 1 << 20;
  c.async.slab_bytes = 256 << 10;
  auto m = CheckpointManager::create(*comm, model.state, c);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::vector<int> started, committed;
  for (int64_t step = 1; step <= 9; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + 3 * ((comm->rank() + step) % 3)));
    auto out = (*m)->step_end(step, 0, {});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->saved, step % 2 == 0);
    EXPECT_EQ(out->in_flight, out->saved);
    started.push_back(out->saved ? 1 : 0);
    committed.push_back(static_cast<int>(out->committed.size()));
  }
  auto last = (*m)->end(9, 0, {});
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_TRUE(last->saved && !last->in_flight);  // the final save is synchronous
  committed.push_back(static_cast<int>(last->committed.size()));
  EXPECT_TRUE(same_on_all_ranks(started));
  EXPECT_TRUE(same_on_all_ranks(committed));
  int total = 0;
  for (int n : committed) total += n;
  EXPECT_EQ(total, 5);  // steps 2, 4, 6, 8 in the background and 9 at the end, once each
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->entries.size(), 2u);

  c.async_save = false;
  expect_resumes(*comm, c, 9);
}

}  // namespace
}  // namespace distckpt
