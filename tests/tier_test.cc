// The node-local tier with in-process ranks that pretend to run on several nodes
// ("{host}" in the local directory gives each pretend node its own): local saves,
// redundancy from the layout, partner copies, XOR and Reed-Solomon parity, node loss,
// corruption, drain, encryption, resharding, and the parity codes themselves.
#include <gtest/gtest.h>

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "comm/local_comm.h"
#include "distckpt/checkpoint.h"
#include "distckpt/encryption.h"
#include "distckpt/inspect.h"
#include "distckpt/manager.h"
#include "distckpt/tier.h"
#include "storage/fault_fs.h"
#include "storage/write_maps.h"
#include "test_util.h"
#include "format/native/sealing.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "transform/float_cast.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;
using internal_comm::run_local_ranks;
using internal_tier::Redundancy;

// One rank's part of a small model at DP x TP: bytes depend on the global element.
struct Model {
  std::vector<std::vector<unsigned char>> buffers;
  StateDict state;
  Model(int rank, int dp, int tp) : state(rank) {
    add("w", DType::kFloat32, *TensorLayout::from_device_matrix({12, 8}, {dp, tp}, {0, -1}), rank, 1);
    add("v", DType::kFloat64, *TensorLayout::from_device_matrix({6, 12}, {dp, tp}, {-1, 0}), rank, 2);
    add("bias", DType::kFloat32, *TensorLayout::from_device_matrix({5}, {dp, tp}, {-1}), rank, 3);
    EXPECT_TRUE(state.set_info("lr", 0.25).ok());
  }
  void add(const std::string& name, DType dt, const TensorLayout& layout, int rank, int salt) {
    Box box = layout.slice_box(rank);
    const std::size_t item = dtype_size(dt);
    std::vector<unsigned char> b(static_cast<std::size_t>(box.num_elements()) * item);
    for (int64_t i = 0; i < box.num_elements(); ++i) {
      int64_t global = 0, rem = i, stride = 1;
      for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
        global += (box.offset[d] + rem % box.shape[d]) * stride;
        rem /= box.shape[d];
        stride *= layout.global_shape()[d];
      }
      for (std::size_t k = 0; k < item; ++k) b[i * item + k] = static_cast<unsigned char>(global * 7 + salt + k);
    }
    buffers.push_back(std::move(b));
    EXPECT_TRUE(state.add_tensor(name, dt, buffers.back().data(), layout).ok());
  }
  void zero() {
    for (auto& b : buffers) std::memset(b.data(), 0, b.size());
  }
};

class TierTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string root() const { return tmp_.path() + "/global"; }
  std::string local() const { return tmp_.path() + "/local/{host}"; }
  std::string node_dir(int node) const { return tmp_.path() + "/local/node" + std::to_string(node); }

  // Saves step `step` as "s<step>" on `world` ranks, `rpn` per node.
  void save_at(int world, int rpn, int dp, int tp, const std::string& redundancy, int step,
               std::shared_ptr<const EncryptionKey> key = nullptr, LocalSaveResult* result = nullptr) {
    std::mutex mu;
    run_local_ranks(
        world,
        [&](Comm& comm) {
          Model m(comm.rank(), dp, tp);
          SaveOptions o;
          o.name = "s" + std::to_string(step);
          o.step = step;
          o.encryption.key = key;
          auto saved = save_local(comm, m.state, root(), o, {local(), redundancy});
          ASSERT_TRUE(saved.ok()) << saved.status().to_string();
          std::lock_guard<std::mutex> lock(mu);
          if (result && comm.rank() == 0) *result = *saved;
        },
        rpn);
  }

  // Restores on `world` ranks (`rpn` per node) at DP x TP; checks the bytes.
  RestoreResult restore_at(int world, int rpn, int dp, int tp, RestoreOptions options = {}) {
    RestoreResult out;
    std::mutex mu;
    run_local_ranks(
        world,
        [&](Comm& comm) {
          Model m(comm.rank(), dp, tp);
          const auto expected = m.buffers;
          m.zero();
          auto r = restore(comm, m.state, root(), {local(), "auto"}, options);
          ASSERT_TRUE(r.ok()) << r.status().to_string();
          EXPECT_EQ(m.buffers, expected) << "rank " << comm.rank();
          std::lock_guard<std::mutex> lock(mu);
          if (comm.rank() == 0) out = *r;
        },
        rpn);
    return out;
  }

  StatusCode remove_local_status(const std::string& name) {
    std::mutex mu;
    StatusCode code = StatusCode::kOk;
    run_local_ranks(
        4,
        [&](Comm& comm) {
          Status st = remove_local(comm, root(), {local(), "auto"}, name);
          std::lock_guard<std::mutex> lock(mu);
          if (comm.rank() == 0) code = st.code();
        },
        2);
    return code;
  }

  // Kills node `node` of the saving job and lets the others take its place: node
  // directories are renumbered as a job on the survivors would name them.
  void lose_node(int node, int nodes) {
    fs::remove_all(node_dir(node));
    for (int n = node + 1; n < nodes; ++n) fs::rename(node_dir(n), node_dir(n - 1));
  }
};

TEST(ParityTest, EncodeAndRebuildEveryLossPattern) {
  for (const char* text : {"xor:2", "xor:3", "xor:5", "rs:1+1", "rs:2+1", "rs:3+2", "rs:4+2"}) {
    const Redundancy r = *internal_tier::parse_redundancy(text);
    const std::size_t bytes = 1000;
    std::mt19937 rng(42);
    std::vector<std::vector<uint8_t>> seg(static_cast<std::size_t>(r.k + r.m), std::vector<uint8_t>(bytes));
    for (int i = 0; i < r.k; ++i)
      for (auto& b : seg[static_cast<std::size_t>(i)]) b = static_cast<uint8_t>(rng());
    std::vector<const uint8_t*> data;
    std::vector<uint8_t*> parity, all;
    for (int i = 0; i < r.k; ++i) data.push_back(seg[static_cast<std::size_t>(i)].data());
    for (int i = 0; i < r.m; ++i) parity.push_back(seg[static_cast<std::size_t>(r.k + i)].data());
    internal_tier::encode_stripe(r, data, parity, bytes);
    const auto original = seg;
    for (auto& s : seg) all.push_back(s.data());
    // Every set of at most m losses.
    const int n = r.k + r.m;
    for (int mask = 1; mask < (1 << n); ++mask) {
      if (__builtin_popcount(static_cast<unsigned>(mask)) > r.m) continue;
      std::vector<bool> present(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        present[static_cast<std::size_t>(i)] = !(mask & (1 << i));
        if (!present[static_cast<std::size_t>(i)]) std::fill(seg[static_cast<std::size_t>(i)].begin(), seg[static_cast<std::size_t>(i)].end(), 0);
      }
      ASSERT_TRUE(internal_tier::decode_stripe(r, all, present, bytes).ok()) << text << " mask " << mask;
      for (int i = 0; i < r.k; ++i) EXPECT_EQ(seg[static_cast<std::size_t>(i)], original[static_cast<std::size_t>(i)]) << text << " mask " << mask;
      seg = original;
      all.clear();
      for (auto& s : seg) all.push_back(s.data());
    }
    // One loss too many is refused.
    std::vector<bool> present(static_cast<std::size_t>(n), true);
    for (int i = 0; i <= r.m; ++i) present[static_cast<std::size_t>(i)] = false;
    EXPECT_EQ(internal_tier::decode_stripe(r, all, present, bytes).code(), StatusCode::kNotFound) << text;
  }
}

TEST(ParityTest, ParsesAndGroups) {
  EXPECT_FALSE(internal_tier::parse_redundancy("xor:1").ok());
  EXPECT_FALSE(internal_tier::parse_redundancy("rs:2").ok());
  EXPECT_FALSE(internal_tier::parse_redundancy("rs:20+20").ok());
  EXPECT_FALSE(internal_tier::parse_redundancy("mirror").ok());
  const Redundancy r = *internal_tier::parse_redundancy("rs:2+1");
  auto few = internal_tier::parity_groups(2, r);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("needs at least 3 nodes; the job runs on 2"), std::string::npos);
  auto groups = *internal_tier::parity_groups(7, r);  // 3 + 4: leftovers join the last group
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].size(), 3u);
  EXPECT_EQ(groups[1].size(), 4u);
  // Every group node holds k data segments in distinct stripes and m parity segments.
  for (int G : {3, 4, 7}) {
    std::vector<int> data(static_cast<std::size_t>(G)), parity(static_cast<std::size_t>(G));
    for (int j = 0; j < G; ++j) {
      auto nodes = internal_tier::stripe_nodes(j, G, r);
      for (int d = 0; d < r.k; ++d) {
        ++data[static_cast<std::size_t>(nodes[static_cast<std::size_t>(d)])];
        EXPECT_EQ(internal_tier::stripe_of(nodes[static_cast<std::size_t>(d)], d, G), j);
      }
      for (int q = 0; q < r.m; ++q) ++parity[static_cast<std::size_t>(nodes[static_cast<std::size_t>(r.k + q)])];
    }
    for (int i = 0; i < G; ++i) {
      EXPECT_EQ(data[static_cast<std::size_t>(i)], r.k);
      EXPECT_EQ(parity[static_cast<std::size_t>(i)], r.m);
    }
  }
}

TEST_F(TierTest, ReplicasOnOtherNodesAreTheRedundancy) {
  LocalSaveResult saved;
  save_at(6, 2, 3, 2, "auto", 5, nullptr, &saved);  // DP3 x TP2: each node holds a whole replica
  EXPECT_EQ(saved.redundancy_bytes, 0u);
  EXPECT_DOUBLE_EQ(saved.storage_ratio, 1.0);
  EXPECT_FALSE(fs::exists(root() + "/s5")) << "nothing global before a drain";
  auto records = list_local_records(root());
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].nodes, 3);
  EXPECT_FALSE((*records)[0].global);
  RestoreResult r = restore_at(6, 2, 3, 2);
  EXPECT_EQ(r.name, "s5");
  EXPECT_GT(r.sources.local, 0u);
  EXPECT_EQ(r.sources.peer + r.sources.parity + r.sources.global, 0u);
  EXPECT_EQ(r.load.step, 5);
  // Each node read its replica once: 3 x the state.
  EXPECT_EQ(r.sources.storage_read, 3 * (12 * 8 * 4 + 6 * 12 * 8 + 5 * 4));

  // A node lost: its ranks get the bytes from another node.
  lose_node(1, 3);
  r = restore_at(6, 2, 3, 2);
  EXPECT_GT(r.sources.peer, 0u);
  EXPECT_EQ(r.sources.global, 0u);
  // On the survivors alone, 4 ranks (a reshard), from the local tier only.
  r = restore_at(4, 2, 2, 2);
  EXPECT_EQ(r.sources.global + r.sources.peer, 0u);
  EXPECT_GT(r.sources.local, 0u);
}

TEST_F(TierTest, PartnerCopyServesALostNode) {
  LocalSaveResult saved;
  save_at(4, 2, 1, 4, "auto", 3, nullptr, &saved);  // TP4 over 2 nodes: nothing replicated elsewhere
  EXPECT_GT(saved.redundancy_bytes, 0u);
  EXPECT_NEAR(saved.storage_ratio, 2.0, 0.2);
  lose_node(1, 2);
  RestoreResult r = restore_at(4, 2, 1, 4);
  EXPECT_GT(r.sources.peer, 0u) << "the partner copy on node 0 is read and sent";
  EXPECT_EQ(r.sources.global, 0u);
}

class TierParityTest : public TierTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(TierParityTest, ALostNodeIsRebuiltFromParity) {
  LocalSaveResult saved;
  save_at(6, 2, 1, 6, GetParam(), 7, nullptr, &saved);  // TP6 over 3 nodes
  const Redundancy red = *internal_tier::parse_redundancy(GetParam());
  EXPECT_NEAR(saved.storage_ratio, 1.0 + static_cast<double>(red.m) / red.k, 0.25) << GetParam();
  for (int victim : {0, 2}) {
    SCOPED_TRACE(victim);
    if (victim == 2) {  // a second save, so that this loss hits fresh files
      save_at(6, 2, 1, 6, GetParam(), 8 + victim);
    }
    // Replaced by a fresh node: same count, one node without any local files.
    fs::remove_all(node_dir(victim));
    RestoreResult r = restore_at(6, 2, 1, 6);
    EXPECT_GT(r.sources.parity, 0u);
    EXPECT_GT(r.sources.parity_read, 0u);
    EXPECT_EQ(r.sources.global, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Codes, TierParityTest, ::testing::Values("xor:3", "rs:2+1", "rs:1+2"));

// fuzz_tier_record starts from these records (a save at xor:3 on 3 nodes, one with partner
// copies): they must stay valid records of this build, or the fuzzer starts from nothing.
TEST(TierRecordSeeds, TheFuzzCorpusRecordsValidate) {
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(std::string(DISTCKPT_FUZZ_CORPUS) + "/tier_record")) {
    auto record = internal_tier::read_record(*posix_filesystem(), entry.path().string());
    EXPECT_TRUE(record.ok()) << entry.path() << ": " << record.status().to_string();
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

// A record (CRC-protected only, when not encrypted) whose files claim sizes that sum past
// 2^62 on one node: refused as corruption, before a parity segment or a rebuild's
// offsets could be computed from a sum that wrapped.
TEST_F(TierTest, ARecordWhoseStreamSumWouldWrapIsCorruption) {
  save_at(6, 2, 1, 6, "xor:3", 3);
  auto record = internal_tier::read_record(*posix_filesystem(), internal_tier::record_path(root(), "s3"));
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  proto::Index hostile = *record;
  int changed = 0;
  for (int f = 0; f < hostile.files_size(); ++f) {
    proto::TierFile* tf = hostile.mutable_tier()->mutable_files(f);
    if (tf->copies(0).node() != 0 || tf->solo_bytes() == 0) continue;
    const uint64_t huge = (uint64_t{1} << 62) - static_cast<uint64_t>(changed);  // each alone is allowed
    hostile.mutable_files(f)->set_size(huge);
    tf->mutable_copies(0)->set_bytes(huge);
    tf->set_solo_bytes(huge);
    ++changed;
  }
  ASSERT_GE(changed, 2) << "node 0 should hold two ranks' files";
  const Status st = internal_tier::validate_placement(hostile, "rec");
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("sum to more than 2^62 bytes"), std::string::npos) << st.to_string();
}

TEST_F(TierTest, CorruptLocalFileIsLostNotData) {
  save_at(6, 2, 3, 2, "auto", 4);
  // Flip a byte in node 0's first data file.
  const std::string file = node_dir(0) + "/s4/data-00000.bin";
  ASSERT_TRUE(fs::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(3);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(3);
    f.write(&c, 1);
  }
  RestoreResult r = restore_at(6, 2, 3, 2);
  EXPECT_GT(r.sources.lost_chunks, 0u);
  EXPECT_GT(r.sources.peer, 0u);
  EXPECT_EQ(r.sources.global, 0u);
}

TEST_F(TierTest, DrainThenEveryLocalCopyLost) {
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
  save_at(4, 2, 1, 4, "none", 6, key);
  run_local_ranks(
      4,
      [&](Comm& comm) {
        SaveOptions o;
        o.encryption.key = key;
        auto d = drain(comm, root(), {local(), "none"}, "s6", o);
        ASSERT_TRUE(d.ok()) << d.status().to_string();
        EXPECT_GT(d->save.bytes_written, 0u);
      },
      2);
  // A normal checkpoint: load reads it, with the key.
  auto records = list_local_records(root());
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE((*records)[0].global);
  fs::remove_all(node_dir(1));
  RestoreOptions o;
  o.load.key = key;
  RestoreResult r = restore_at(4, 2, 1, 4, o);
  EXPECT_GT(r.sources.global, 0u);
  EXPECT_GT(r.sources.local, 0u);  // node 0's bytes still come from node 0
  EXPECT_EQ(r.sources.parity, 0u);
  // Without the key: refused, never loaded.
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        auto bad = restore(comm, m.state, root(), {local(), "auto"}, {});
        EXPECT_EQ(bad.status().code(), StatusCode::kAuthFailed) << bad.status().to_string();
      },
      2);
}

// LoadOptions::cast_floats from every source: this node, a peer (sent in the stored
// dtype), a parity rebuild and the global root, onto another layout; without it a
// dtype change is refused, and integers are never cast.
TEST_F(TierTest, CastFloatsFromEveryTier) {
  save_at(6, 2, 1, 6, "xor:3", 2);  // TP6 over 3 nodes
  run_local_ranks(6, [&](Comm& comm) { ASSERT_TRUE(drain(comm, root(), {local(), "xor:3"}, "s2", {}).ok()); }, 2);
  fs::remove_all(node_dir(1));  // a fresh node in its place
  // The model as stored (float32 w and bias, float64 v) restored at DP3 x TP2 into
  // bfloat16 w, float32 v and float16 bias.
  auto cast_restore = [&](bool cast, bool global_only, RestoreResult* out) {
    std::mutex mu;
    run_local_ranks(
        6,
        [&](Comm& comm) {
          Model stored(comm.rank(), 3, 2);
          const DType want[] = {DType::kBFloat16, DType::kFloat32, DType::kFloat16};
          std::vector<std::vector<unsigned char>> expected(3), got(3);
          StateDict state(comm.rank());
          for (std::size_t i = 0; i < 3; ++i) {
            const TensorEntry& e = stored.state.tensors()[i];
            const auto n = static_cast<std::size_t>(e.boxes[0].num_elements());
            expected[i].resize(n * dtype_size(want[i]));
            got[i].assign(n * dtype_size(want[i]), 0);
            internal_transform::cast_floats(e.buffers[0], e.dtype, expected[i].data(), want[i], n);
            ASSERT_TRUE(state.add_tensor(e.name, want[i], got[i].data(), e.layout).ok());
          }
          RestoreOptions o;
          o.load.cast_floats = cast;
          o.global_only = global_only;
          auto r = restore(comm, state, root(), {local(), "xor:3"}, o);
          if (!cast) {
            EXPECT_EQ(r.status().code(), StatusCode::kMismatch) << r.status().to_string();
            EXPECT_NE(r.status().message().find("cast_floats"), std::string::npos) << r.status().to_string();
            return;
          }
          ASSERT_TRUE(r.ok()) << r.status().to_string();
          EXPECT_EQ(got, expected) << "rank " << comm.rank();
          std::lock_guard<std::mutex> lock(mu);
          if (comm.rank() == 0 && out) *out = *r;
        },
        2);
  };
  cast_restore(false, false, nullptr);
  RestoreResult r;
  cast_restore(true, false, &r);
  EXPECT_GT(r.sources.local, 0u);
  EXPECT_GT(r.sources.peer, 0u);
  EXPECT_GT(r.sources.parity, 0u);
  EXPECT_EQ(r.sources.global, 0u);
  cast_restore(true, true, &r);
  EXPECT_GT(r.sources.global, 0u);
  EXPECT_EQ(r.sources.local + r.sources.peer + r.sources.parity, 0u);
  // Integers are never cast.
  run_local_ranks(
      6,
      [&](Comm& comm) {
        Model stored(comm.rank(), 3, 2);
        StateDict state(comm.rank());
        std::vector<std::vector<unsigned char>> bytes;
        for (const TensorEntry& e : stored.state.tensors()) {
          bytes.emplace_back(static_cast<std::size_t>(e.boxes[0].num_elements()) * 4);
          ASSERT_TRUE(state.add_tensor(e.name, DType::kInt32, bytes.back().data(), e.layout).ok());
        }
        RestoreOptions o;
        o.load.cast_floats = true;
        EXPECT_EQ(restore(comm, state, root(), {local(), "xor:3"}, o).status().code(), StatusCode::kMismatch);
      },
      2);
}

TEST_F(TierTest, LossesBeyondRedundancyFallBackToAnOlderCheckpoint) {
  save_at(4, 2, 1, 4, "none", 1);
  run_local_ranks(4, [&](Comm& comm) { ASSERT_TRUE(drain(comm, root(), {local(), "none"}, "s1", {}).ok()); }, 2);
  save_at(4, 2, 1, 4, "none", 2);  // never drained
  fs::remove_all(node_dir(1));
  RestoreResult r = restore_at(4, 2, 1, 4);
  EXPECT_EQ(r.name, "s1");
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("s2"), std::string::npos);
}

// A name belongs to one checkpoint across the tiers: a global save does not take a
// record's name, and a global checkpoint that is not the record's drained copy (another
// step) never fills in for its lost local bytes.
TEST_F(TierTest, ANameIsOneCheckpointAcrossTiers) {
  save_at(4, 2, 1, 4, "none", 2);
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        SaveOptions o;
        o.name = "s2";
        auto clash = save(comm, m.state, root(), o);
        EXPECT_EQ(clash.status().code(), StatusCode::kAlreadyExists) << clash.status().to_string();
        // The same bytes at another step, saved globally elsewhere and put under this root.
        o.step = 9;
        ASSERT_TRUE(save(comm, m.state, tmp_.path() + "/other", o).ok());
      },
      2);
  EXPECT_FALSE(fs::exists(root() + "/s2"));
  fs::rename(tmp_.path() + "/other/s2", root() + "/s2");
  fs::remove_all(node_dir(1));  // redundancy none: node 1's bytes are gone
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        auto r = restore(comm, m.state, root(), {local(), "auto"}, {});
        EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
        EXPECT_NE(r.status().message().find("was not drained"), std::string::npos) << r.status().to_string();
      },
      2);
}

// A save that does not move `latest` (an exception save) is listed, restorable by
// name, but never the default resume point.
TEST_F(TierTest, SavesThatDoNotMoveLatestAreNotResumedByDefault) {
  save_at(4, 2, 1, 4, "none", 1);
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        SaveOptions o;
        o.name = "crash";
        o.step = 2;
        o.update_latest = false;
        ASSERT_TRUE(save_local(comm, m.state, root(), o, {local(), "none"}).ok());
      },
      2);
  auto records = list_local_records(root());
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].name, "crash");
  EXPECT_FALSE((*records)[0].advances_latest);
  EXPECT_TRUE((*records)[1].advances_latest);
  EXPECT_EQ(restore_at(4, 2, 1, 4).name, "s1");
  RestoreOptions by_name;
  by_name.name = "crash";
  EXPECT_EQ(restore_at(4, 2, 1, 4, by_name).name, "crash");
  // Only saves that do not move latest: nothing to restore by default (a fresh start).
  fs::remove(root() + "/.distckpt/tier/s1");
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        auto r = restore(comm, m.state, root(), {local(), "auto"}, {});
        EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
      },
      2);
  RestoreOptions hostile;
  hostile.name = "../s1";
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        auto r = restore(comm, m.state, root(), {local(), "auto"}, hostile);
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
      },
      2);
}

TEST_F(TierTest, RefusedSetups) {
  run_local_ranks(
      6,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 6);
        SaveOptions o;
        o.name = "x";
        auto few = save_local(comm, m.state, root(), o, {local(), "rs:3+1"});
        EXPECT_EQ(few.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(few.status().message().find("needs at least 4 nodes; the job runs on 3"), std::string::npos);
        auto shared = save_local(comm, m.state, root(), o, {tmp_.path() + "/same", "auto"});
        EXPECT_EQ(shared.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(shared.status().message().find("node-local"), std::string::npos) << shared.status().to_string();
        // Another redundancy (or recycling) on one rank would send it into other exchanges.
        LocalTier odd{local(), comm.rank() == 3 ? "partner" : "auto"};
        auto mixed = save_local(comm, m.state, root(), o, odd);
        EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(mixed.status().message().find("redundancy and recycle must be the same on every rank"),
                  std::string::npos)
            << mixed.status().to_string();
        LocalTier recycling{local(), "auto", comm.rank() == 4};
        auto recycled = save_local(comm, m.state, root(), o, recycling);
        EXPECT_EQ(recycled.status().code(), StatusCode::kInvalidArgument) << recycled.status().to_string();
      },
      2);
  EXPECT_FALSE(fs::exists(root() + "/.distckpt/tier/x"));
  // One node's leader cannot make its node id (a file where its directory goes): every
  // rank gets that leader's error, which names its rank and directory.
  fs::create_directories(tmp_.path() + "/local");
  std::ofstream(tmp_.path() + "/local/node1") << "not a directory";
  std::vector<std::string> messages(6);
  run_local_ranks(
      6,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 6);
        SaveOptions o;
        o.name = "y";
        const Status st = save_local(comm, m.state, root(), o, {local(), "auto"}).status();
        messages[static_cast<std::size_t>(comm.rank())] = st.to_string();
      },
      2);
  for (const std::string& message : messages) {
    EXPECT_EQ(message, messages[0]);
    EXPECT_NE(message.find("rank 2: local tier '" + tmp_.path() + "/local/node1'"), std::string::npos) << message;
  }
  EXPECT_FALSE(fs::exists(root() + "/.distckpt/tier/y"));
}

// ---- the manager's policy ----

CheckpointConfig tier_config(const std::string& root, const std::string& local) {
  CheckpointConfig c;
  c.directory = root;
  c.prefix = "step";
  c.name_template = "{prefix}-{step}";
  c.local = {local, "auto"};
  c.local_every_steps = 1;
  c.global_every = 1;
  c.keep_local = 1;
  c.keep_max = 1;
  return c;
}

TEST_F(TierTest, RetentionPerTierNeverRemovesWhatADrainReads) {
  // Drains are slowed down (every write into the global root waits), so that local saves
  // and retention run while a drain reads the local files of an older checkpoint.
  internal_storage::FaultSpec slow;
  slow.hook = [&](const std::string& op, const std::string& path) {
    if (op == "write" && path.find("/global/") != std::string::npos && path.find(".tmp-") != std::string::npos)
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
  };
  auto fsys = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), slow);
  std::mutex mu;
  std::vector<std::string> drained, removed;
  int overlapped = 0;
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 1, 4);
        CheckpointConfig c = tier_config(root(), local());
        c.fs = fsys;
        auto mgr = CheckpointManager::create(comm, m.state, c);
        ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
        for (int64_t step = 1; step <= 8; ++step) {
          auto out = (*mgr)->step_end(step, 0);
          ASSERT_TRUE(out.ok()) << out.status().to_string();
          EXPECT_TRUE(out->drain_error.ok()) << out->drain_error.to_string();
          EXPECT_TRUE(out->saved);
          EXPECT_EQ(out->tier, "local");
          if (comm.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            for (auto& d : out->drained) drained.push_back(d);
            for (auto& r : out->removed) removed.push_back(r);
            if (out->drained.empty() && step > 1) ++overlapped;
          }
        }
        auto last = (*mgr)->end(8, 0);
        ASSERT_TRUE(last.ok()) << last.status().to_string();
        EXPECT_TRUE(last->drain_error.ok()) << last->drain_error.to_string();
        if (comm.rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          for (auto& d : last->drained) drained.push_back(d);
        }
      },
      2);
  EXPECT_GT(overlapped, 0) << "no local save happened while a drain was in flight";
  ASSERT_FALSE(drained.empty());
  EXPECT_EQ(drained.back(), root() + "/step-8") << "end() drains the final state";
  // Retention per tier: one local record, one global checkpoint, both the newest.
  auto records = list_local_records(root());
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].name, "step-8");
  EXPECT_TRUE((*records)[0].global);
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  std::vector<std::string> global;
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted) global.push_back(e.name);
  EXPECT_EQ(global, std::vector<std::string>{"step-8"});
  bool local_removed = false;
  for (const auto& r : removed) local_removed |= r.rfind("local:", 0) == 0;
  EXPECT_TRUE(local_removed);
  // Only the newest checkpoint's files are left on each node.
  for (int n = 0; n < 2; ++n) {
    std::set<std::string> left;
    for (const auto& e : fs::directory_iterator(node_dir(n)))
      if (e.is_directory()) left.insert(e.path().filename().string());
    EXPECT_EQ(left, std::set<std::string>{"step-8"}) << "node " << n;
  }
}

// The bytes between chunks (each starts at a multiple of 64) of the node-local data
// files of checkpoint `name` under `shm` are zeros: a recycled file's old bytes are
// overwritten there too.
void expect_zero_gaps(const std::string& root, const std::string& shm, const std::string& name,
                      const EncryptionKey* key) {
  auto record = internal_tier::read_record(*posix_filesystem(), internal_tier::record_path(root, name));
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  proto::Index index = *record;
  ASSERT_TRUE(internal_format::open_index(&index, key, root).ok());
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> chunks;  // file -> [begin, end)
  for (const auto& t : index.tensors())
    for (const auto& c : t.chunks())
      chunks[index.files(static_cast<int>(c.file_id())).name()].emplace_back(c.byte_offset(), c.byte_offset() + c.length());
  int files = 0;
  uint64_t gap_bytes = 0;
  for (const auto& node : fs::directory_iterator(shm))
    for (auto& [file, ranges] : chunks) {
      const fs::path path = node.path() / name / file;
      if (!fs::exists(path)) continue;
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), {});
      std::sort(ranges.begin(), ranges.end());
      uint64_t at = 0;
      for (std::size_t k = 0; k <= ranges.size(); ++k) {
        const uint64_t next = k < ranges.size() ? ranges[k].first : bytes.size();
        for (uint64_t i = at; i < next; ++i) ASSERT_EQ(bytes[i], '\0') << path << ": byte " << i << " between chunks";
        gap_bytes += next > at ? next - at : 0;
        if (k < ranges.size()) at = std::max(at, ranges[k].second);
      }
      ++files;
    }
  EXPECT_GT(files, 0) << name;
  EXPECT_GT(gap_bytes, 0u) << name << ": the model leaves no gap to check";
}

// On tmpfs, recycled files are written through mappings the process keeps
// (storage/write_maps.h): a new mapping, then the kept one, synchronously, encrypted and
// in the background. The spares are scribbled over before each save: every byte restored
// must be the save's own.
TEST(TierTmpfs, RecycledFilesWrittenThroughMappingsRestoreTheirOwnBytes) {
  struct statfs sfs;
  if (::statfs("/dev/shm", &sfs) != 0 || sfs.f_type != TMPFS_MAGIC)
    GTEST_SKIP() << "cannot run: /dev/shm is not a tmpfs here (only tmpfs files are written through mappings)";
  std::string shm = "/dev/shm/distckpt-tier-XXXXXX";
  ASSERT_NE(::mkdtemp(shm.data()), nullptr);
  testing::TempDir tmp;
  const std::string root = tmp.path() + "/global";
  const LocalTier tier{shm + "/{host}", "auto", true};
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
  auto fg = internal_comm::make_local_comms(2, 2);
  auto bg = internal_comm::make_local_comms(2, 2);
  auto scribble = [&] {
    for (const auto& node : fs::directory_iterator(shm))
      if (fs::exists(node.path() / ".distckpt-spare"))
        for (const auto& e : fs::directory_iterator(node.path() / ".distckpt-spare")) {
          std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
          const std::string junk(static_cast<std::size_t>(e.file_size()), '\x5a');
          f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
        }
  };
  int salt = 0;
  for (const char* name : {"s1", "s2", "s3", "s4", "s5"}) {
    const bool encrypted = std::string(name) == "s4", in_background = std::string(name) == "s5";
    scribble();
    ++salt;
    const uint64_t reuses_before = internal_storage::kept_mapping_reuses();
    run_local_ranks(
        2,
        [&](Comm& comm) {
          Model m(comm.rank(), 1, 2);
          // A tensor of 1.2 MiB per rank: many 256 KiB pieces and pages per file.
          m.add("big", DType::kFloat32, *TensorLayout::from_device_matrix({600, 1024}, {1, 2}, {-1, 0}), comm.rank(), 4);
          for (auto& b : m.buffers)
            for (auto& c : b) c = static_cast<unsigned char>(c + salt);
          SaveOptions o;
          o.name = name;
          if (encrypted) o.encryption.key = key;
          if (in_background) {
            const auto r = static_cast<std::size_t>(comm.rank());
            auto a = AsyncCheckpointer::create(std::move(fg[r]), std::move(bg[r]));  // collective
            ASSERT_TRUE(a.ok());
            ASSERT_TRUE((*a)->save_local_async(m.state, root, o, tier).ok());
            auto done = (*a)->wait_local();
            ASSERT_TRUE(done.ok()) << done.status().to_string();
          } else {
            auto saved = save_local(comm, m.state, root, o, tier);
            ASSERT_TRUE(saved.ok()) << saved.status().to_string();
          }
          const auto expected = m.buffers;
          m.zero();
          RestoreOptions ro;
          ro.name = name;
          ro.fall_back = false;
          if (encrypted) ro.load.key = key;
          auto r = restore(comm, m.state, root, tier, ro);
          ASSERT_TRUE(r.ok()) << r.status().to_string();
          EXPECT_EQ(r->sources.global, 0u) << "from the local tier only";
          EXPECT_EQ(m.buffers, expected) << name << ", rank " << comm.rank();
          if (comm.rank() == 0) expect_zero_gaps(root, shm, name, encrypted ? key.get() : nullptr);
          ASSERT_TRUE(remove_local(comm, root, tier, name).ok());
        },
        2);
    // From the second save on, the files are spares whose pages exist: mapped (one per
    // rank, both in this process), and kept while they have a name; from the third on the
    // kept mappings are written again.
    if (std::string(name) != "s1") EXPECT_EQ(internal_storage::kept_write_mappings(), 2u) << name;
    const uint64_t reused = internal_storage::kept_mapping_reuses() - reuses_before;
    EXPECT_EQ(reused, std::string(name) == "s1" || std::string(name) == "s2" ? 0u : 2u) << name;
  }
  run_local_ranks(2, [&](Comm& comm) { release_local_spares(comm, tier); }, 2);
  EXPECT_EQ(internal_storage::kept_write_mappings(), 0u) << "the spares' memory is given back";
  fs::remove_all(shm);
}

TEST_F(TierTest, AsyncLocalSavesCommitInTheBackgroundAndResume) {
  auto fg = internal_comm::make_local_comms(4, 2);
  auto bg = internal_comm::make_local_comms(4, 2);
  std::mutex mu;
  std::vector<std::string> committed;
  run_local_ranks(
      4,
      [&](Comm& comm) {
        AsyncOptions small;
        small.staging_bytes = 1 << 20;
        small.slab_bytes = 256 << 10;
        const auto r = static_cast<std::size_t>(comm.rank());
        auto async = AsyncCheckpointer::create(std::move(fg[r]), std::move(bg[r]), small);
        ASSERT_TRUE(async.ok()) << async.status().to_string();
        Model m(comm.rank(), 2, 2);
        CheckpointConfig c = tier_config(root(), local());
        c.async_save = true;
        c.local_every_steps = 2;
        c.global_every = 2;
        c.keep_local = 2;
        c.keep_max = 0;
        auto mgr = CheckpointManager::create(comm, m.state, c, std::move(*async));
        ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
        for (int64_t step = 1; step <= 6; ++step) {
          auto out = (*mgr)->step_end(step, 0);
          ASSERT_TRUE(out.ok()) << out.status().to_string();
          if (step % 2 == 0) {
            EXPECT_TRUE(out->saved && out->in_flight);
          }
          if (comm.rank() == 0)
            for (auto& d : out->committed) {
              std::lock_guard<std::mutex> lock(mu);
              committed.push_back(d);
            }
        }
        auto last = (*mgr)->end(6, 0);
        ASSERT_TRUE(last.ok()) << last.status().to_string();
        EXPECT_TRUE(last->drain_error.ok());
      },
      2);
  EXPECT_GE(committed.size(), 2u);
  // A new job resumes step 6 from the hosts' local tier.
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        const auto expected = m.buffers;
        m.zero();
        auto mgr = CheckpointManager::create(comm, m.state, tier_config(root(), local()));
        ASSERT_TRUE(mgr.ok());
        auto resumed = (*mgr)->resume();
        ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
        EXPECT_EQ(resumed->step, 6);
        EXPECT_GT(resumed->sources.local, 0u);
        EXPECT_EQ(resumed->sources.global, 0u);
        EXPECT_EQ(m.buffers, expected);
      },
      2);
}

// LocalTier::recycle: a removed local checkpoint's files become its node's spares, the
// next local save overwrites them (sized to its own files, every byte its own), a link
// planted among the spares is never written through, and the manager's end() gives the
// spares back.
TEST_F(TierTest, RemovedCheckpointsFilesAreRecycled) {
  auto spares = [&](int node) {
    std::vector<std::string> names;
    const std::string dir = node_dir(node) + "/.distckpt-spare";
    if (fs::exists(dir))
      for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    return names;
  };
  auto file_sizes = [&](const std::string& name) {
    std::map<std::string, uintmax_t> sizes;
    for (int n = 0; n < 2; ++n)
      for (const auto& e : fs::recursive_directory_iterator(node_dir(n) + "/" + name))
        if (e.is_regular_file() && e.path().filename() != "record")
          sizes[std::to_string(n) + "/" + e.path().filename().string()] = e.file_size();
    return sizes;
  };
  // A bigger checkpoint first (DP1 x TP4 with partner copies: larger files per node).
  save_at(4, 2, 1, 4, "auto", 1);
  run_local_ranks(4, [&](Comm& comm) { ASSERT_TRUE(remove_local(comm, root(), {local(), "auto"}, "s1").ok()); }, 2);
  EXPECT_FALSE(fs::exists(root() + "/.distckpt/tier/s1"));
  EXPECT_FALSE(fs::exists(node_dir(0) + "/s1"));
  ASSERT_FALSE(spares(0).empty());
  ASSERT_FALSE(spares(1).empty());
  // A link among the spares must never be written through.
  const std::string outside = tmp_.path() + "/outside";
  { std::ofstream(outside) << "untouched"; }
  fs::create_symlink(outside, node_dir(0) + "/.distckpt-spare/aaaa-link");
  // Nor a second name of another file (a hard link).
  const std::string other = tmp_.path() + "/other";
  { std::ofstream(other) << "untouched too"; }
  fs::create_hard_link(other, node_dir(1) + "/.distckpt-spare/aaaa-hardlink");
  // The next save, of other bytes, at DP2 x TP2: written into the spares.
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        for (auto& b : m.buffers)
          for (auto& c : b) c = static_cast<unsigned char>(c ^ 0xa5);
        SaveOptions o;
        o.name = "s2";
        o.step = 2;
        ASSERT_TRUE(save_local(comm, m.state, root(), o, {local(), "auto"}).ok());
      },
      2);
  { std::ifstream in(outside); std::string text; in >> text; EXPECT_EQ(text, "untouched"); }
  { std::ifstream in(other); std::string text; std::getline(in, text); EXPECT_EQ(text, "untouched too"); }
  EXPECT_LT(spares(0).size() + spares(1).size(), 8u);
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        std::vector<std::vector<unsigned char>> expected = m.buffers;
        for (auto& b : expected)
          for (auto& c : b) c = static_cast<unsigned char>(c ^ 0xa5);
        m.zero();
        auto r = restore(comm, m.state, root(), {local(), "auto"}, {});
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(r->name, "s2");
        EXPECT_EQ(m.buffers, expected);
      },
      2);
  // The same files as a save without spares: sized to their own bytes.
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        SaveOptions o;
        o.name = "s3";
        o.step = 3;
        ASSERT_TRUE(save_local(comm, m.state, root(), o, {local(), "auto", false}).ok());
      },
      2);
  EXPECT_EQ(file_sizes("s2"), file_sizes("s3"));
  // Without recycle, removal leaves no spares; the manager's end() gives them all back.
  run_local_ranks(4, [&](Comm& comm) { release_local_spares(comm, {local(), "auto"}); }, 2);
  run_local_ranks(4, [&](Comm& comm) { ASSERT_TRUE(remove_local(comm, root(), {local(), "auto", false}, "s3").ok()); }, 2);
  EXPECT_TRUE(spares(0).empty());
  EXPECT_EQ(remove_local_status("s3"), StatusCode::kNotFound);
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        CheckpointConfig c = tier_config(root(), local());
        c.global_every = 0;  // no drain holds an old one back: each step_end saves, then retires
        auto mgr = CheckpointManager::create(comm, m.state, c);
        ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
        for (int64_t step = 10; step <= 13; ++step) ASSERT_TRUE((*mgr)->step_end(step, 0).ok());
        comm.barrier();
        if (comm.rank() == 0) EXPECT_TRUE(fs::exists(node_dir(0) + "/.distckpt-spare")) << "retention kept the files as spares";
        comm.barrier();
        ASSERT_TRUE((*mgr)->end(13, 0).ok());
      },
      2);
  EXPECT_FALSE(fs::exists(node_dir(0) + "/.distckpt-spare"));
  EXPECT_FALSE(fs::exists(node_dir(1) + "/.distckpt-spare"));
  // A manager destroyed without end() (a failure, an exception) gives them back too.
  run_local_ranks(
      4,
      [&](Comm& comm) {
        Model m(comm.rank(), 2, 2);
        CheckpointConfig c = tier_config(root(), local());
        auto mgr = CheckpointManager::create(comm, m.state, c);
        ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
        for (int64_t step = 20; step <= 22; ++step) ASSERT_TRUE((*mgr)->step_end(step, 0).ok());
      },
      2);
  EXPECT_FALSE(fs::exists(node_dir(0) + "/.distckpt-spare"));
  // Spares in a directory that is not owner-only, or of another user, are never taken:
  // checkpoint bytes must not go into a file someone else can read.
  if (::geteuid() == 0) {
    save_at(4, 2, 2, 2, "auto", 30);
    run_local_ranks(4, [&](Comm& comm) { ASSERT_TRUE(remove_local(comm, root(), {local(), "auto"}, "s30").ok()); }, 2);
    const std::string theirs = node_dir(0) + "/.distckpt-spare";
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    auto inode = [](const fs::path& p) {
      struct stat st;
      return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t{0};
    };
    std::set<uint64_t> theirs_inodes;
    for (const auto& e : fs::directory_iterator(theirs)) theirs_inodes.insert(inode(e.path()));
    ASSERT_FALSE(theirs_inodes.empty());
    save_at(4, 2, 2, 2, "auto", 31);
    // The new data files were made fresh while those files still existed (the leftovers
    // go after step 2), so they would share an inode only if one had been taken.
    int data_files = 0;
    for (const auto& e : fs::directory_iterator(node_dir(0) + "/s31"))
      if (e.path().filename().string().rfind("data-", 0) == 0) {
        ++data_files;
        EXPECT_EQ(theirs_inodes.count(inode(e.path())), 0u) << "a spare of another user was written into";
      }
    EXPECT_GT(data_files, 0);
  } else {
    std::printf("RemovedCheckpointsFilesAreRecycled: the other-user case needs root (chown); not run\n");
  }
}

// Two jobs in one root, each with an identity (a requeued Slurm job): a requeued job
// resumes its own series from the tiers even when the other job committed later.
TEST_F(TierTest, ARequeuedJobResumesItsOwnSeries) {
  auto run_job = [&](const std::string& job, int64_t steps, int salt_step) {
    run_local_ranks(
        4,
        [&](Comm& comm) {
          Model m(comm.rank(), 2, 2);
          CheckpointConfig c = tier_config(root(), local());
          c.job_id = job;
          c.keep_local = 3;
          c.keep_max = 3;
          auto mgr = CheckpointManager::create(comm, m.state, c);
          ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
          for (int64_t step = 1; step <= steps; ++step) {
            ASSERT_TRUE(m.state.set_info("salt", int64_t{salt_step}).ok());
            ASSERT_TRUE((*mgr)->step_end(step, 0).ok());
          }
        },
        2);
  };
  run_job("a", 2, 1);
  run_job("b", 3, 2);  // later commits, in series step_1
  auto resume_as = [&](const std::string& job) {
    ResumeResult out;
    std::mutex mu;
    run_local_ranks(
        4,
        [&](Comm& comm) {
          Model m(comm.rank(), 2, 2);
          CheckpointConfig c = tier_config(root(), local());
          c.job_id = job;
          auto mgr = CheckpointManager::create(comm, m.state, c);
          ASSERT_TRUE(mgr.ok()) << mgr.status().to_string();
          auto resumed = (*mgr)->resume();
          ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
          std::lock_guard<std::mutex> lock(mu);
          if (comm.rank() == 0) out = *resumed;
        },
        2);
    return out;
  };
  ResumeResult a = resume_as("a");
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(fs::path(a.path).filename(), "step-2");
  ResumeResult b = resume_as("b");
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(fs::path(b.path).filename(), "step_1-3");
  // A job without an identity takes the newest of the root.
  EXPECT_EQ(resume_as("").step, 3);
}

}  // namespace
}  // namespace distckpt
