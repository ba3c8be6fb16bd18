// Sharded save/load under mpirun with several rank counts.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "distckpt/distckpt.h"
#include "mpi_test_util.h"
#include "base/bounce.h"
#include "storage/fault_fs.h"

namespace distckpt {
namespace {

using testing::SharedTempDir;
using testing::world_rank;
using testing::world_size;

// DP x TP factorisation of the world used by the tests: TP=2 when even.
void dp_tp(int world, int* dp, int* tp) {
  *tp = world % 2 == 0 ? 2 : 1;
  *dp = world / *tp;
}

uint8_t byte_at(int64_t global_index, int tensor, std::size_t k) {
  return static_cast<uint8_t>(global_index * 31 + tensor * 7 + k * 3 + 1);
}

// The rank's slices of a model with one tensor per dtype plus a replicated bias and
// an irregular explicit-box tensor, filled with bytes derived from global indices.
struct Model {
  StateDict state{world_rank()};
  std::vector<std::vector<uint8_t>> bufs;

  explicit Model(bool fill = true) {
    int dp, tp;
    dp_tp(world_size(), &dp, &tp);
    int t = 0;
    for (DType dt : kAllDTypes) {
      const Shape map = t % 2 == 0 ? Shape{0, -1} : Shape{-1, 0};
      add("param." + std::string(dtype_name(dt)), dt,
          *TensorLayout::from_device_matrix({6, 10}, {dp, tp}, map), t, fill);
      ++t;
    }
    add("bias", DType::kFloat32, *TensorLayout::from_device_matrix({7}, {dp, tp}, {-1}), t++, fill);
    // 11 rows over the world, irregular: rank r gets [r*11/W, (r+1)*11/W).
    const int w = world_size();
    std::vector<std::vector<Box>> boxes;
    for (int r = 0; r < w; ++r) boxes.push_back({Box{{int64_t(r) * 11 / w, 0}, {int64_t(r + 1) * 11 / w - int64_t(r) * 11 / w, 3}}});
    add("irregular", DType::kInt32, *TensorLayout::from_boxes({11, 3}, boxes), t++, fill);
  }

  void add(const std::string& name, DType dt, const TensorLayout& layout, int tensor, bool fill) {
    const Box box = layout.boxes_of(world_rank())[0];
    const std::size_t item = dtype_size(dt);
    std::vector<uint8_t> b(static_cast<std::size_t>(box.num_elements()) * item, 0);
    if (fill) {
      const int64_t cols = box.shape.size() == 2 ? layout.global_shape()[1] : 1;
      for (int64_t i = 0; i < box.num_elements(); ++i) {
        const int64_t g = box.shape.size() == 2
                              ? (box.offset[0] + i / box.shape[1]) * cols + box.offset[1] + i % box.shape[1]
                              : box.offset[0] + i;
        for (std::size_t k = 0; k < item; ++k)
          b[i * item + k] = dt == DType::kBool ? (g + tensor) % 2 : byte_at(g, tensor, k);
      }
    }
    bufs.push_back(std::move(b));
    ASSERT_TRUE(state.add_tensor(name, dt, bufs.back().data(), layout).ok());
  }
};

std::unique_ptr<Comm> world_comm() { return make_mpi_comm(MPI_COMM_WORLD); }

TEST(CheckpointMpiTest, RoundTripEveryDtypeWithDedupAndBalance) {
  SharedTempDir tmp;
  auto comm = world_comm();
  Model m;
  ASSERT_TRUE(m.state.set_info("epoch_num", int64_t{3}).ok());
  ASSERT_TRUE(m.state.set_info("loss", 0.25).ok());
  SaveOptions opts;
  opts.name = "step-5";
  opts.step = 5;
  opts.epoch = 3;
  auto saved = save(*comm, m.state, tmp.path(), opts);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  // Replicas removed: exactly the unique bytes are written.
  EXPECT_EQ(saved->bytes_written, saved->bytes_unique);

  auto info = read_checkpoint_info(saved->path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->world_size, world_size());
  // Each unique slice appears once.
  for (const auto& t : info->tensors) {
    std::set<Box> boxes;
    for (const auto& c : t.chunks) EXPECT_TRUE(boxes.insert(c.box).second) << t.name;
  }
  // Balanced: with DP >= 2 every rank writes something, and no rank writes more than
  // its fair share plus the largest slice.
  std::vector<uint64_t> per_rank(world_size(), 0);
  uint64_t largest = 0;
  for (const auto& t : info->tensors)
    for (const auto& c : t.chunks) {
      per_rank[c.writer_rank] += c.length;
      largest = std::max(largest, c.length);
    }
  for (int r = 0; r < world_size(); ++r)
    EXPECT_LE(per_rank[r], saved->bytes_unique / world_size() + largest) << "rank " << r;

  const auto expected = m.bufs;
  Model fresh(/*fill=*/false);
  auto loaded = load(*comm, fresh.state, saved->path, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(fresh.bufs, expected);
  EXPECT_EQ(loaded->step, 5);
  EXPECT_EQ(loaded->epoch, 3);
  EXPECT_EQ(std::get<double>(loaded->info.at("loss")), 0.25);
  // Shared replica reads over real MPI: each unique box read once, then sent.
  Model shared(/*fill=*/false);
  LoadOptions shared_reads;
  shared_reads.replica_reads = LoadOptions::ReplicaReads::kShared;
  auto again = load(*comm, shared.state, saved->path, shared_reads);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(shared.bufs, expected);
  EXPECT_EQ(again->bytes_read, saved->bytes_unique);
  // Each box sent as soon as it is read (Comm::Exchange), whether chunks are read
  // directly or through the page cache.
  Model buffered(/*fill=*/false);
  shared_reads.direct_reads = false;
  auto third = load(*comm, buffered.state, saved->path, shared_reads);
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(buffered.bufs, expected);
  EXPECT_EQ(third->bytes_read, saved->bytes_unique);
  EXPECT_EQ(third->bytes_read_direct, 0u);
  if (world_rank() == 0) {
    auto report = verify_checkpoint(saved->path);
    EXPECT_TRUE(report.ok()) << report.status().to_string();
  }
}

TEST(CheckpointMpiTest, RankFailingMidSaveFailsEveryRankAndKeepsPrevious) {
  SharedTempDir tmp;
  auto comm = world_comm();
  Model m;
  SaveOptions opts;
  opts.name = "good";
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), opts).ok());

  // The last rank runs out of space in the middle of its data file.
  const int victim = world_size() - 1;
  if (world_rank() == victim) {
    internal_storage::FaultSpec spec;
    spec.write_budget = 7;
    spec.budget_path_contains = "data-";
    opts.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  }
  opts.name = "bad";
  auto bad = save(*comm, m.state, tmp.path(), opts);
  ASSERT_FALSE(bad.ok());
  // Same error everywhere, naming the failing rank.
  const std::string msg = bad.status().to_string();
  testing::expect_same_on_all_ranks(msg);
  EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left"), std::string::npos) << msg;
  comm->barrier();
  if (world_rank() == 0) {
    EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/bad"));
    auto listing = list_checkpoints(tmp.path());
    ASSERT_TRUE(listing.ok());
    ASSERT_EQ(listing->entries.size(), 1u);
    EXPECT_EQ(listing->entries[0].name, "good");
    EXPECT_EQ(listing->latest, "good");
    EXPECT_TRUE(verify_checkpoint(tmp.path() + "/good").ok());
  }
  // The previous checkpoint still loads.
  Model fresh(false);
  auto loaded = load(*comm, fresh.state, tmp.path(), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(fresh.bufs, m.bufs);
}

TEST(CheckpointMpiTest, CorruptedChunkIsReportedOnEveryRank) {
  SharedTempDir tmp;
  auto comm = world_comm();
  Model m;
  SaveOptions opts;
  opts.name = "ck";
  auto saved = save(*comm, m.state, tmp.path(), opts);
  ASSERT_TRUE(saved.ok());
  if (world_rank() == 0) {
    // Flip one byte inside the 'bias' chunk (read by every rank).
    auto info = read_checkpoint_info(saved->path);
    ASSERT_TRUE(info.ok());
    for (const auto& t : info->tensors) {
      if (t.name != "bias") continue;
      const auto& c = t.chunks[0];
      std::fstream f(saved->path + "/" + c.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(c.byte_offset + 3));
      char b;
      f.read(&b, 1);
      b ^= 0x11;
      f.seekp(static_cast<std::streamoff>(c.byte_offset + 3));
      f.write(&b, 1);
    }
  }
  comm->barrier();
  Model fresh(false);
  LoadOptions shared_reads;
  shared_reads.replica_reads = LoadOptions::ReplicaReads::kShared;  // one reader: the others must not hang
  auto loaded = load(*comm, fresh.state, saved->path, shared_reads);
  ASSERT_FALSE(loaded.ok());
  const std::string msg = loaded.status().to_string();
  testing::expect_same_on_all_ranks(msg);
  EXPECT_NE(msg.find("tensor 'bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("crc32c"), std::string::npos) << msg;
  EXPECT_EQ(loaded.status().code(), StatusCode::kCorruption);
}

// A rank whose reads fail mid-load (EIO on its data files), with shared replica reads
// over real MPI: its peers wait for boxes it was to read and send. It sends them anyway,
// and every rank reports its error; nobody hangs. Direct and buffered reads alike.
TEST(CheckpointMpiTest, ReadErrorOnOneRankFailsEveryRankWithSharedReads) {
  SharedTempDir tmp;
  auto comm = world_comm();
  Model m;
  SaveOptions opts;
  opts.name = "ck";
  auto saved = save(*comm, m.state, tmp.path(), opts);
  ASSERT_TRUE(saved.ok());
  const int victim = world_size() - 1;
  for (bool direct : {true, false}) {
    Model fresh(false);
    LoadOptions shared_reads;
    shared_reads.replica_reads = LoadOptions::ReplicaReads::kShared;
    shared_reads.direct_reads = direct;
    if (world_rank() == victim) {
      internal_storage::FaultSpec spec;
      spec.fail_read_if_contains = "data-";
      shared_reads.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    }
    auto loaded = load(*comm, fresh.state, saved->path, shared_reads);
    ASSERT_FALSE(loaded.ok());
    const std::string msg = loaded.status().to_string();
    testing::expect_same_on_all_ranks(msg);
    EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
    EXPECT_NE(msg.find("Input/output error (injected)"), std::string::npos) << msg;
  }
}

TEST(CheckpointMpiTest, InconsistentStateDictsAreRejectedOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  SharedTempDir tmp;
  auto comm = world_comm();
  StateDict sd(world_rank());
  std::vector<float> buf(4);
  auto layout = TensorLayout::from_device_matrix({4}, {world_size()}, {-1});
  ASSERT_TRUE(sd.add_tensor(world_rank() == 1 ? "other" : "w", DType::kFloat32, buf.data(), *layout).ok());
  SaveOptions opts;
  opts.name = "ck";
  auto saved = save(*comm, sd, tmp.path(), opts);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(saved.status().message().find("rank 1"), std::string::npos) << saved.status().message();
  testing::expect_same_on_all_ranks(saved.status().to_string());
  if (world_rank() == 0) EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/ck"));
}

TEST(CheckpointMpiTest, BackToBackSavesMoveLatest) {
  SharedTempDir tmp;
  auto comm = world_comm();
  Model m;
  for (int step = 1; step <= 3; ++step) {
    SaveOptions opts;
    opts.name = "step-" + std::to_string(step);
    opts.step = step;
    ASSERT_TRUE(save(*comm, m.state, tmp.path(), opts).ok());
  }
  if (world_rank() == 0) {
    auto listing = list_checkpoints(tmp.path());
    ASSERT_TRUE(listing.ok());
    EXPECT_EQ(listing->entries.size(), 3u);
    EXPECT_EQ(listing->latest, "step-3");
  }
  Model fresh(false);
  auto loaded = load(*comm, fresh.state, tmp.path(), {});
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 3);
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

// docs/design.md's example layout on a world too small for it: a clear error on every rank,
// nothing committed (the save must never commit what load would refuse).
TEST(CheckpointMpiTest, LayoutNamingMissingRanksIsRefused) {
  SharedTempDir tmp;
  auto comm = world_comm();
  auto layout = TensorLayout::from_device_matrix({32, 16}, {2, 4}, {1, -1});
  ASSERT_TRUE(layout.ok());
  if (world_size() >= 8) GTEST_SKIP() << "the layout fits this world";
  std::vector<float> buf(16 * 16);
  StateDict sd(world_rank());
  ASSERT_TRUE(sd.add_tensor("w", DType::kFloat32, buf.data(), *layout).ok());
  SaveOptions opts;
  opts.name = "ck";
  auto saved = save(*comm, sd, tmp.path(), opts);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(saved.status().message().find("tensor 'w'"), std::string::npos) << saved.status().message();
  testing::expect_same_on_all_ranks(saved.status().to_string());
  comm->barrier();
  if (world_rank() == 0) {
    auto listing = list_checkpoints(tmp.path());
    EXPECT_TRUE(!listing.ok() || listing->entries.empty());
  }
}


// The MPI communicator's point-to-point exchange: messages of every size around its 1 MiB
// pieces and the 64 KiB where receives start to bounce (base/bounce.h), several to each
// peer, land whole and in the order listed, whether receives go through the warm slots
// or straight into place. More bounced pieces are wanted at once than there are slots
// (a wrong slot copy fails it: tried by breaking the copy by one byte).
TEST(CheckpointMpiTest, ExchangeMovesEveryByteBouncedOrNot) {
  const int me = world_rank(), n = world_size();
  if (n == 1) GTEST_SKIP() << "one rank: no peer to exchange with";
  const std::vector<std::size_t> sizes = {0, 100, (64 << 10) - 1, 64 << 10, (3 << 20) + 17, 1 << 20};
  auto byte = [](int from, int to, std::size_t k, std::size_t i) {
    return static_cast<char>(from * 53 + to * 29 + k * 7 + i % 251);
  };
  for (const bool bounce : {true, false}) {
    for (const bool started : {true, false}) {
      SCOPED_TRACE(std::string(bounce ? "bounced" : "in place") + (started ? ", start_exchange" : ", transfer"));
      internal_base::force_bounce_io_for_testing(bounce);
      auto comm = world_comm();  // agrees on how messages are cut (bounced: 1 MiB pieces)
      std::vector<std::string> out, in;
      std::vector<Comm::Transfer> sends, receives;
      out.reserve(sizes.size() * n);
      in.reserve(sizes.size() * n);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          std::string bytes(sizes[k], '\0');
          for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = byte(me, peer, k, i);
          out.push_back(std::move(bytes));
          sends.push_back({peer, out.back().data(), out.back().size()});
          in.emplace_back(sizes[k], '\0');
          receives.push_back({peer, in.back().data(), in.back().size()});
        }
      }
      if (started) {
        auto exchange = comm->start_exchange();
        for (const auto& t : receives) exchange->post_receive(t);
        for (const auto& t : sends) exchange->post_send(t);
        exchange->progress();
        exchange->wait();
      } else {
        comm->transfer(sends, receives);
      }
      std::size_t at = 0, wrong = 0;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        for (std::size_t k = 0; k < sizes.size(); ++k, ++at)
          for (std::size_t i = 0; i < sizes[k]; ++i) wrong += in[at][i] != byte(peer, me, k, i);
      }
      EXPECT_EQ(wrong, 0u);
    }
  }
  internal_base::force_bounce_io_for_testing(std::nullopt);
}

}  // namespace
}  // namespace distckpt
