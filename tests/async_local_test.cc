// Async save with in-process ranks (threads): each rank has a foreground and a
// background communicator, as make_async_checkpointer(MPI_Comm) would make.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comm/local_comm.h"
#include "distckpt/async.h"
#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "storage/fault_fs.h"
#include "test_util.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;

// A rank's model: a row-split weight (DP x TP) and a replicated bias, float32.
struct Model {
  std::vector<float> w, b;
  StateDict state;
  Model(int rank, int world, float base) : state(rank) {
    const int tp = world % 2 == 0 ? 2 : 1;
    auto wl = TensorLayout::from_device_matrix({64, 96}, {world / tp, tp}, {0, -1});
    auto bl = TensorLayout::from_device_matrix({96}, {world / tp, tp}, {-1});
    const Box box = wl->slice_box(rank);
    w.resize(static_cast<std::size_t>(box.num_elements()));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = base + static_cast<float>(box.offset[0] * 96 + i);
    b.assign(96, base * 2);
    EXPECT_TRUE(state.add_tensor("w", DType::kFloat32, w.data(), *wl).ok());
    EXPECT_TRUE(state.add_tensor("b", DType::kFloat32, b.data(), *bl).ok());
    EXPECT_TRUE(state.set_info("base", static_cast<double>(base)).ok());
  }
};

// Runs fn(rank, checkpointer, load_comm) on `world` threads, each with its own
// AsyncCheckpointer over two fresh in-process groups and a third group for loads.
// Tests stage little (the default, 1 GiB per rank, would dominate their run time).
AsyncOptions small_staging() {
  AsyncOptions o;
  o.staging_bytes = 1 << 20;
  o.slab_bytes = 256 << 10;
  return o;
}

void run_async(int world, const AsyncOptions& options,
               const std::function<void(int, AsyncCheckpointer&, Comm&)>& fn) {
  auto fg = internal_comm::make_local_comms(world);
  auto bg = internal_comm::make_local_comms(world);
  auto other = internal_comm::make_local_comms(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto ckpt = AsyncCheckpointer::create(std::move(fg[r]), std::move(bg[r]), options);
      ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
      fn(r, **ckpt, *other[r]);
    });
  for (auto& t : threads) t.join();
}

class AsyncLocalTest : public ::testing::TestWithParam<int> {
 protected:
  testing::TempDir tmp_;
  std::string root() const { return tmp_.path() + "/ckpts"; }
  static SaveOptions named(const std::string& name) {
    SaveOptions o;
    o.name = name;
    return o;
  }
  // Loads `name` into a fresh model and checks it holds `base`'s values.
  void expect_loads(Comm& comm, const std::string& name, float base) {
    Model expected(comm.rank(), comm.size(), base);
    Model got(comm.rank(), comm.size(), -1);
    auto r = load(comm, got.state, root() + "/" + name, {});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(got.w, expected.w);
    EXPECT_EQ(got.b, expected.b);
  }
};

TEST_P(AsyncLocalTest, CallerMayOverwriteItsTensorsOnceSaveAsyncReturns) {
  run_async(GetParam(), small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 1.0f);
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("a")).ok());
    std::fill(m.w.begin(), m.w.end(), -7.0f);  // the training loop goes on
    std::fill(m.b.begin(), m.b.end(), -7.0f);
    auto r = ckpt.wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->bytes_written, r->bytes_unique);
    EXPECT_EQ(ckpt.wait().status().code(), StatusCode::kNotFound);  // reported once
    expect_loads(comm, "a", 1.0f);
  });
  EXPECT_TRUE(verify_checkpoint(root() + "/a").ok());
}

TEST_P(AsyncLocalTest, StagingSmallerThanTheStatePipelines) {
  AsyncOptions small;
  small.staging_bytes = 8192;  // 2 slabs of 4 KiB for ~12 KiB per rank and more
  small.slab_bytes = 4096;
  run_async(GetParam(), small, [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 2.0f);
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("p")).ok());
    std::fill(m.w.begin(), m.w.end(), 0.0f);
    ASSERT_TRUE(ckpt.wait().ok());
    expect_loads(comm, "p", 2.0f);
  });
}

// Encrypted, with staging smaller than the state: chunks are encrypted on their way into
// the slabs (CBC padding crosses slab edges) while the writer thread writes earlier ones.
TEST_P(AsyncLocalTest, EncryptedSavesPipelineAndLoadWithTheKey) {
  AsyncOptions small;
  small.staging_bytes = 8192;
  small.slab_bytes = 4096;
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(16, 'k')));
  for (EncryptionMode mode : {EncryptionMode::kAesGcm, EncryptionMode::kSm4Cbc}) {
    const std::string name = mode == EncryptionMode::kAesGcm ? "gcm" : "sm4";
    run_async(GetParam(), small, [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
      Model m(rank, comm.size(), 3.0f);
      SaveOptions o = named(name);
      o.encryption = {mode, key};
      ASSERT_TRUE(ckpt.save_async(m.state, root(), o).ok());
      std::fill(m.w.begin(), m.w.end(), 0.0f);
      ASSERT_TRUE(ckpt.wait().ok());
      Model got(rank, comm.size(), -1);
      LoadOptions lo;
      lo.key = key;
      ASSERT_TRUE(load(comm, got.state, root() + "/" + name, lo).ok());
      Model expected(rank, comm.size(), 3.0f);
      EXPECT_EQ(got.w, expected.w);
      EXPECT_EQ(got.b, expected.b);
      EXPECT_EQ(load(comm, got.state, root() + "/" + name, {}).status().code(), StatusCode::kAuthFailed);
    });
    VerifyOptions vo;
    vo.key = key;
    auto report = verify_checkpoint(root() + "/" + name, vo);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_TRUE(report->authenticated);
  }
}

TEST_P(AsyncLocalTest, BackgroundFailureReachesEveryRankAndKeepsPrevious) {
  const int world = GetParam();
  std::mutex mu;
  std::vector<std::string> errors;
  run_async(world, small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 3.0f);
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("good")).ok());
    ASSERT_TRUE(ckpt.wait().ok());
    SaveOptions bad = named("bad");
    if (rank == 0) {  // rank 0 always writes (the replicated bias is balanced to others)
      internal_storage::FaultSpec spec;
      spec.write_budget = 0;  // ENOSPC on the first write of the background writer
      spec.budget_path_contains = "data-";
      bad.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    }
    ASSERT_TRUE(ckpt.save_async(m.state, root(), bad).ok());
    auto r = ckpt.wait();
    ASSERT_FALSE(r.ok());
    {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(r.status().to_string());
    }
    // The failure was reported: the next save goes ahead.
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("after")).ok());
    ASSERT_TRUE(ckpt.end().ok());
    expect_loads(comm, "good", 3.0f);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(e, errors[0]);
    EXPECT_NE(e.find("No space left"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(root() + "/bad"));
  EXPECT_TRUE(verify_checkpoint(root() + "/after").ok());
}

TEST_P(AsyncLocalTest, UnreportedFailureIsReportedByTheNextSaveAsync) {
  const int world = GetParam();
  run_async(world, small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 4.0f);
    SaveOptions bad = named("bad");
    if (rank == 0) {
      internal_storage::FaultSpec spec;
      spec.fail_rename_if_contains = "/bad.tmp-";  // the commit fails in the background
      bad.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    }
    ASSERT_TRUE(ckpt.save_async(m.state, root(), bad).ok());
    Status next = ckpt.save_async(m.state, root(), named("next"));
    EXPECT_NE(next.message().find("rename"), std::string::npos) << next.to_string();
    EXPECT_TRUE(ckpt.end().ok());  // nothing left to report: "next" never started
    (void)comm;
  });
  EXPECT_FALSE(fs::exists(root() + "/bad"));
  EXPECT_FALSE(fs::exists(root() + "/next"));
}

// wait() is not collective: when only rank 0 collects a background failure, the next
// save_async still returns that failure on every rank (no rank starts a new save alone).
TEST_P(AsyncLocalTest, FailureCollectedByOneRankIsStillReportedEverywhere) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "needs a rank that did not call wait()";
  std::mutex mu;
  std::vector<std::string> next_errors;
  run_async(world, small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 8.0f);
    SaveOptions bad = named("bad");
    if (rank == 0) {
      internal_storage::FaultSpec spec;
      spec.write_budget = 0;
      spec.budget_path_contains = "data-";
      bad.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    }
    ASSERT_TRUE(ckpt.save_async(m.state, root(), bad).ok());
    if (rank == 0) EXPECT_FALSE(ckpt.wait().ok());
    Status next = ckpt.save_async(m.state, root(), named("next"));
    {
      std::lock_guard<std::mutex> lock(mu);
      next_errors.push_back(next.to_string());
    }
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("after")).ok());
    ASSERT_TRUE(ckpt.end().ok());
  });
  for (const auto& e : next_errors) {
    EXPECT_EQ(e, next_errors[0]);
    EXPECT_NE(e.find("No space left"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(root() + "/next"));
  EXPECT_TRUE(verify_checkpoint(root() + "/after").ok());
}

TEST_P(AsyncLocalTest, BackToBackSavesWaitForEachOther) {
  run_async(GetParam(), small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 0.0f);
    for (int i = 1; i <= 3; ++i) {
      Model step(rank, comm.size(), static_cast<float>(i));
      ASSERT_TRUE(ckpt.save_async(step.state, root(), named("s" + std::to_string(i))).ok());
    }
    ASSERT_TRUE(ckpt.end().ok());
    for (int i = 1; i <= 3; ++i) expect_loads(comm, "s" + std::to_string(i), static_cast<float>(i));
  });
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/s3");
}

TEST_P(AsyncLocalTest, RefusedWhileBusyOnEveryRank) {
  AsyncOptions refuse = small_staging();
  refuse.refuse_when_busy = true;
  std::atomic<bool> release{false};
  std::atomic<int> refused{0};
  internal_storage::FaultSpec spec;
  // Hold every writer in its fsync until the test has tried a second save.
  spec.hook = [&](const std::string& op, const std::string& path) {
    if (op == "sync_dir" || path.find("data-") == std::string::npos) return;
    if (op == "sync")
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  auto slow = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  run_async(GetParam(), refuse, [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 5.0f);
    SaveOptions first = named("first");
    first.fs = slow;
    ASSERT_TRUE(ckpt.save_async(m.state, root(), first).ok());
    Status second = ckpt.save_async(m.state, root(), named("second"));
    EXPECT_EQ(second.code(), StatusCode::kBusy) << second.to_string();
    if (second.code() == StatusCode::kBusy && ++refused == comm.size()) release = true;
    ASSERT_TRUE(ckpt.wait().ok());
    expect_loads(comm, "first", 5.0f);
  });
  EXPECT_FALSE(fs::exists(root() + "/second"));
}

// Ranks that ask for different formats would run different protocols (a gather for a
// single file, a sharded write otherwise): every rank is refused alike, nothing waits.
TEST_P(AsyncLocalTest, FormatsThatDifferAcrossRanksAreRefusedOnEveryRank) {
  if (GetParam() < 2) GTEST_SKIP() << "needs two ranks to differ";
  run_async(GetParam(), small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 7.0f);
    SaveOptions o = named("mixed");
    if (rank == 1) o.format = Format::kSafetensors;
    const Status st = ckpt.save_async(m.state, root(), o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("format and integrated must be the same on every rank"), std::string::npos)
        << st.to_string();
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("after")).ok());
    ASSERT_TRUE(ckpt.wait().ok());
    expect_loads(comm, "after", 7.0f);
  });
  EXPECT_FALSE(fs::exists(root() + "/mixed"));
  EXPECT_FALSE(fs::exists(root() + "/mixed.safetensors"));
}

TEST_P(AsyncLocalTest, DestroyingWithASaveInFlightCompletesIt) {
  run_async(GetParam(), small_staging(), [&](int rank, AsyncCheckpointer& ckpt, Comm& comm) {
    Model m(rank, comm.size(), 6.0f);
    ASSERT_TRUE(ckpt.save_async(m.state, root(), named("last")).ok());
    (void)comm;
  });  // each checkpointer is destroyed with its save in flight
  EXPECT_TRUE(verify_checkpoint(root() + "/last").ok());
}

INSTANTIATE_TEST_SUITE_P(Ranks, AsyncLocalTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace distckpt
