// Save/load through the public API with N in-process ranks (threads), so the
// collective logic, the commit protocol and every failure path run without mpirun.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include "base/bounce.h"
#include "comm/local_comm.h"
#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "format/native/index_codec.h"
#include "local_ranks.h"
#include "storage/fault_fs.h"
#include "test_util.h"
#include "transform/float_cast.h"

namespace distckpt {
namespace {

using internal_comm::run_local_ranks;
namespace fs = std::filesystem;

// One rank's copy of a small model: every dtype, DP x TP layouts, deterministic bytes.
struct Model {
  std::vector<std::vector<unsigned char>> buffers;
  StateDict state;

  Model(int rank, int world, uint8_t salt = 1) : state(rank) {
    const int tp = world % 2 == 0 ? 2 : 1;
    const int dp = world / tp;
    int t = 0;
    for (DType dt : kAllDTypes) {
      const std::string name = "p." + std::string(dtype_name(dt));
      // Alternate row and column splits over TP; replicated over DP.
      const Shape map = t % 2 == 0 ? Shape{0, -1} : Shape{-1, 0};
      auto layout = TensorLayout::from_device_matrix({4, 6}, {dp, tp}, map);
      add(name, dt, *layout, rank, salt + t);
      ++t;
    }
    auto bias = TensorLayout::from_device_matrix({5}, {dp, tp}, {-1});
    add("bias", DType::kFloat32, *bias, rank, 99);
    EXPECT_TRUE(state.set_info("step_num", int64_t{10}).ok());  // agrees with the saves' step
    EXPECT_TRUE(state.set_info("lr", 0.5).ok());
    EXPECT_TRUE(state.set_info("tag", "hello").ok());
    EXPECT_TRUE(state.set_info("flag", true).ok());
  }
  void add(const std::string& name, DType dt, const TensorLayout& layout, int rank, int salt) {
    Box box = layout.slice_box(rank);
    const std::size_t item = dtype_size(dt);
    std::vector<unsigned char> b(static_cast<std::size_t>(box.num_elements()) * item);
    // Byte value depends on the global element index, so every layout agrees.
    for (int64_t i = 0; i < box.num_elements(); ++i) {
      int64_t global = 0, rem = i, stride = 1;
      for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
        const int64_t coord = box.offset[d] + rem % box.shape[d];
        rem /= box.shape[d];
        global += coord * stride;
        stride *= layout.global_shape()[d];
      }
      for (std::size_t k = 0; k < item; ++k)
        b[i * item + k] = dt == DType::kBool ? (global + salt) % 2 : static_cast<unsigned char>(global * 7 + salt + k);
    }
    buffers.push_back(std::move(b));
    EXPECT_TRUE(state.add_tensor(name, dt, buffers.back().data(), layout).ok());
  }
  void zero() {
    for (auto& b : buffers) std::memset(b.data(), 0, b.size());
  }
  std::vector<std::vector<unsigned char>> snapshot() const { return buffers; }
};

// Whether the POSIX file system reads this file with O_DIRECT (not on tmpfs, nor where
// the file system refuses it).
bool reads_directly(const std::string& path) {
  auto file = posix_filesystem()->open_readable(path);
  return file.ok() && (*file)->can_read_direct();
}

// Runs `fn(rank, comm)` on `world` threads; collects each rank's Status text.
std::vector<std::string> run(int world, const std::function<Status(Comm&)>& fn) {
  std::vector<std::string> out(world);
  std::mutex mu;
  run_local_ranks(world, [&](Comm& comm) {
    Status st = fn(comm);
    std::lock_guard<std::mutex> lock(mu);
    out[comm.rank()] = st.to_string();
  });
  return out;
}

void expect_all_equal(const std::vector<std::string>& statuses, const std::string& contains) {
  for (const auto& s : statuses) {
    EXPECT_EQ(s, statuses[0]);
    EXPECT_NE(s.find(contains), std::string::npos) << s;
  }
}

// Parameters: number of in-process ranks, and whether saves use direct I/O (the
// staged O_DIRECT engine) or the buffered path, so both carry every failure test.
class LocalCheckpointTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  testing::TempDir tmp_;
  std::string root() const { return tmp_.path() + "/ckpts"; }
  static int world() { return std::get<0>(GetParam()); }
  static SaveOptions options(const std::string& name) {
    SaveOptions opts;
    opts.name = name;
    opts.direct_io = std::get<1>(GetParam());
    return opts;
  }

  Status save_model(Comm& comm, const std::string& name, std::shared_ptr<FileSystem> fsys = nullptr,
                    uint8_t salt = 1) {
    Model m(comm.rank(), comm.size(), salt);
    SaveOptions opts = options(name);
    opts.step = 10;
    opts.epoch = 2;
    opts.fs = std::move(fsys);
    return save(comm, m.state, root(), opts).status();
  }
};

// MindSpore's step_num and epoch_num in the info beside a save's own step and epoch: a
// checkpoint must not carry two steps, so a contradiction is refused on every rank.
TEST_P(LocalCheckpointTest, InfoCountersThatContradictTheSaveAreRefused) {
  const int world = this->world();
  for (const char* key : {"step_num", "epoch_num"}) {
    auto statuses = run(world, [&](Comm& comm) -> Status {
      Model m(comm.rank(), world);
      EXPECT_TRUE(m.state.set_info("step_num", int64_t{10}).ok());
      if (comm.rank() == world - 1) EXPECT_TRUE(m.state.set_info(key, int64_t{7}).ok());  // one rank is enough
      SaveOptions opts = options("ck");
      opts.step = 10;
      opts.epoch = 3;
      return save(comm, m.state, root(), opts).status();
    });
    for (const auto& s : statuses) EXPECT_NE(s.find("invalid argument"), std::string::npos) << s;
    EXPECT_NE(statuses[static_cast<std::size_t>(world - 1)].find(std::string(key) + "' = 7 contradicts"), std::string::npos)
        << statuses.back();
    EXPECT_FALSE(fs::exists(root() + "/ck"));
  }
}

TEST_P(LocalCheckpointTest, RoundTripEveryDtype) {
  const int world = this->world();
  auto statuses = run(world, [&](Comm& comm) -> Status {
    Model m(comm.rank(), world);
    const auto expected = m.snapshot();
    SaveOptions opts = options("ck");
    opts.step = 10;
    auto saved = save(comm, m.state, root(), opts);
    DISTCKPT_RETURN_IF_ERROR(saved);
    EXPECT_EQ(saved->bytes_written, saved->bytes_unique);
    m.zero();
    auto loaded = load(comm, m.state, root() + "/ck", {});
    DISTCKPT_RETURN_IF_ERROR(loaded);
    EXPECT_EQ(m.buffers, expected);
    EXPECT_EQ(loaded->step, 10);
    EXPECT_EQ(std::get<int64_t>(loaded->info.at("step_num")), 10);
    EXPECT_EQ(std::get<double>(loaded->info.at("lr")), 0.5);
    EXPECT_EQ(std::get<std::string>(loaded->info.at("tag")), "hello");
    EXPECT_TRUE(std::get<bool>(loaded->info.at("flag")));
    EXPECT_EQ(loaded->loaded.size(), m.state.tensors().size());
    // Replicas sharing the reads: each unique box is read once, then sent.
    m.zero();
    LoadOptions shared;
    shared.replica_reads = LoadOptions::ReplicaReads::kShared;
    auto again = load(comm, m.state, root() + "/ck", shared);
    DISTCKPT_RETURN_IF_ERROR(again);
    EXPECT_EQ(m.buffers, expected);
    EXPECT_EQ(again->bytes_read, saved->bytes_unique);
    // How the chunks were read: a checkpoint saved with O_DIRECT is not in the page
    // cache, so the load reads it directly too (where the file system takes O_DIRECT);
    // one saved through the cache is still there, and read from there. With
    // direct_reads off, never directly. The same bytes every way.
    if (!std::get<1>(GetParam())) EXPECT_EQ(again->bytes_read_direct, 0u);
    else if (reads_directly(root() + "/ck/data-00000.bin")) EXPECT_EQ(again->bytes_read_direct, again->bytes_read);
    m.zero();
    LoadOptions buffered;
    buffered.direct_reads = false;
    auto third = load(comm, m.state, root() + "/ck", buffered);
    DISTCKPT_RETURN_IF_ERROR(third);
    EXPECT_EQ(m.buffers, expected);
    EXPECT_EQ(third->bytes_read_direct, 0u);
    return Status();
  });
  expect_all_equal(statuses, "ok");
  auto report = verify_checkpoint(root() + "/ck");
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_FALSE(report->deep);
  VerifyOptions deep;
  deep.deep = true;
  auto deep_report = verify_checkpoint(root() + "/ck", deep);
  ASSERT_TRUE(deep_report.ok()) << deep_report.status().to_string();
  EXPECT_TRUE(deep_report->deep);
  EXPECT_EQ(deep_report->bytes_checked, report->bytes_checked);
  EXPECT_EQ(deep_report->chunks, report->chunks);
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->latest, "ck");
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/ck");
}

TEST_P(LocalCheckpointTest, FailedWriteOnOneRankFailsAllAndKeepsPrevious) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "good"); }), "ok");
  const int victim = world - 1;
  auto statuses = run(world, [&](Comm& comm) {
    std::shared_ptr<FileSystem> fsys;
    if (comm.rank() == victim) {
      internal_storage::FaultSpec spec;
      spec.write_budget = 10;  // ENOSPC after 10 bytes
      spec.budget_path_contains = "data-";
      fsys = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    }
    return save_model(comm, "bad", fsys, 5);
  });
  expect_all_equal(statuses, "No space left on device");
  if (world > 1) EXPECT_NE(statuses[0].find("rank " + std::to_string(victim)), std::string::npos) << statuses[0];
  EXPECT_FALSE(fs::exists(root() + "/bad"));
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 1u) << "the tmp directory must be removed";
  EXPECT_EQ(listing->latest, "good");
  EXPECT_TRUE(verify_checkpoint(root() + "/good").ok());
}

TEST_P(LocalCheckpointTest, FsyncAndRenameFailuresAreAgreed) {
  const int world = this->world();
  internal_storage::FaultSpec sync_fault;
  sync_fault.fail_sync_if_contains = "data-";
  auto sync_fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), sync_fault);
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "a", c.rank() == 0 ? sync_fs : nullptr); }),
                   "fsync");
  internal_storage::FaultSpec rename_fault;
  rename_fault.fail_rename_if_contains = "/b.tmp-";  // the commit's rename
  auto rename_fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), rename_fault);
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "b", rename_fs); }), "rename");
  EXPECT_FALSE(fs::exists(root() + "/a"));
  EXPECT_FALSE(fs::exists(root() + "/b"));
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  EXPECT_TRUE(listing->entries.empty());
}

TEST_P(LocalCheckpointTest, ExistingNameIsRefused) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "x"); }), "ok");
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "x"); }), "already exists");
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "no/slash"); }), "not allowed");
}

// Expects every rank's load of checkpoint `ck` to fail the same way, whether replicas
// read for themselves or share reads (then only one rank reads the damaged bytes, and
// nobody may be left waiting for data it cannot send).
void expect_load_fails(int world, const std::string& root, const std::string& contains) {
  for (auto mode : {LoadOptions::ReplicaReads::kEach, LoadOptions::ReplicaReads::kShared}) {
    auto statuses = run(world, [&](Comm& comm) {
      Model m(comm.rank(), world);
      LoadOptions opts;
      opts.replica_reads = mode;
      return load(comm, m.state, root + "/ck", opts).status();
    });
    expect_all_equal(statuses, contains);
  }
}

// Expects checkpoint `ck` to load on every rank with the model's bytes.
void expect_loads_intact(int world, const std::string& root) {
  expect_all_equal(run(world, [&](Comm& comm) -> Status {
                     Model m(comm.rank(), world);
                     const auto expected = m.snapshot();
                     m.zero();
                     DISTCKPT_RETURN_IF_ERROR(load(comm, m.state, root + "/ck", {}));
                     EXPECT_EQ(m.buffers, expected);
                     return Status();
                   }),
                   "ok");
}

TEST_P(LocalCheckpointTest, CorruptTruncatedAndMissingFiles) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "ck"); }), "ok");
  const std::string data = root() + "/ck/data-00000.bin";
  const auto size = fs::file_size(data);
  auto flip = [&](uint64_t at) {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  };
  // A byte of a gap between chunks (chunks start at multiples of 64): no tensor reads
  // it, so loads succeed; verify finds it.
  auto listed = read_checkpoint_info(root() + "/ck");
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  uint64_t gap = 0;
  for (const auto& t : listed->tensors)
    for (const auto& c : t.chunks)
      if (c.file == "data-00000.bin" && c.length % 64 != 0 && c.byte_offset + c.length < size) gap = c.byte_offset + c.length;
  ASSERT_GT(gap, 0u) << "the model's tensors leave no gap in data-00000.bin";
  {
    flip(gap);
    expect_loads_intact(world, root());
    auto damaged = verify_checkpoint(root() + "/ck");
    EXPECT_NE(damaged.status().message().find("byte " + std::to_string(gap) + ", between chunks, is not zero"),
              std::string::npos)
        << damaged.status().to_string();
    flip(gap);
    ASSERT_TRUE(verify_checkpoint(root() + "/ck").ok());
  }
  flip(size - 1);  // the last chunk's last byte
  expect_load_fails(world, root(), "crc32c");
  auto verify = verify_checkpoint(root() + "/ck");
  EXPECT_NE(verify.status().message().find("data-00000.bin"), std::string::npos) << verify.status().message();
  EXPECT_NE(verify.status().message().find("tensor '"), std::string::npos);
  VerifyOptions deep;
  deep.deep = true;  // finds the same damage
  EXPECT_EQ(verify_checkpoint(root() + "/ck", deep).status().message(), verify.status().message());

  fs::resize_file(data, size - 1);
  expect_load_fails(world, root(), "truncated");
  auto truncated = verify_checkpoint(root() + "/ck");
  EXPECT_NE(truncated.status().message().find("(truncated): tensor '"), std::string::npos)
      << truncated.status().message();
  fs::remove(data);
  expect_load_fails(world, root(), "missing");
  fs::remove(root() + "/ck/index.pb");
  // Other writers' data files left without an index: a damaged checkpoint, not an empty root.
  expect_load_fails(world, root(), fs::exists(root() + "/ck/data-00001.bin") ? "holds data files but no index.pb" : "not found");
}

// A rank whose reads fail (EIO) fails the load on every rank with its error, whether
// replicas read for themselves or share (then its peers wait for boxes it was to read
// and send: it sends them anyway, and the agreement after the exchange fails everyone).
TEST_P(LocalCheckpointTest, ReadErrorOnOneRankFailsEveryRankWithoutHanging) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "ck"); }), "ok");
  const int victim = world - 1;
  internal_storage::FaultSpec spec;
  spec.fail_read_if_contains = "data-";
  auto failing = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  for (auto mode : {LoadOptions::ReplicaReads::kEach, LoadOptions::ReplicaReads::kShared})
    for (bool direct : {true, false}) {
      auto statuses = run(world, [&](Comm& comm) {
        Model m(comm.rank(), world);
        LoadOptions opts;
        opts.replica_reads = mode;
        opts.direct_reads = direct;
        if (comm.rank() == victim) opts.fs = failing;
        return load(comm, m.state, root() + "/ck", opts).status();
      });
      expect_all_equal(statuses, "Input/output error (injected)");
      EXPECT_NE(statuses[0].find("rank " + std::to_string(victim)), std::string::npos) << statuses[0];
      EXPECT_NE(statuses[0].find("tensor '"), std::string::npos) << statuses[0];
    }
  expect_loads_intact(world, root());  // the checkpoint itself is fine
}

TEST_P(LocalCheckpointTest, MismatchesAreClearErrors) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "ck"); }), "ok");
  // Unknown tensor name: strict fails, non-strict reports it.
  auto strict = run(world, [&](Comm& comm) {
    Model m(comm.rank(), world);
    std::vector<float> extra(3);
    auto l = TensorLayout::from_device_matrix({3}, {comm.size()}, {-1});
    EXPECT_TRUE(m.state.add_tensor("extra", DType::kFloat32, extra.data(), *l).ok());
    return load(comm, m.state, root() + "/ck", {}).status();
  });
  expect_all_equal(strict, "tensor 'extra' is not in checkpoint");
  // A mismatch found on any tensor leaves every buffer of every rank untouched.
  auto untouched = run(world, [&](Comm& comm) -> Status {
    Model m(comm.rank(), world, /*salt=*/9);
    const auto before = m.snapshot();
    std::vector<float> extra(3);
    auto l = TensorLayout::from_device_matrix({3}, {comm.size()}, {-1});
    EXPECT_TRUE(m.state.add_tensor("zz.extra", DType::kFloat32, extra.data(), *l).ok());
    Status st = load(comm, m.state, root() + "/ck", {}).status();
    EXPECT_EQ(m.buffers, before);
    return st;
  });
  expect_all_equal(untouched, "tensor 'zz.extra' is not in checkpoint");
  auto lenient = run(world, [&](Comm& comm) -> Status {
    Model m(comm.rank(), world);
    std::vector<float> extra(3);
    auto l = TensorLayout::from_device_matrix({3}, {comm.size()}, {-1});
    EXPECT_TRUE(m.state.add_tensor("extra", DType::kFloat32, extra.data(), *l).ok());
    LoadOptions opts;
    opts.strict = false;
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, m.state, root() + "/ck", opts));
    EXPECT_EQ(r.missing_in_checkpoint, std::vector<std::string>{"extra"});
    return Status();
  });
  expect_all_equal(lenient, "ok");
  // A stored tensor the state has no place for (torch's unexpected key): refused by name
  // unless allow_unexpected, which reports it; a load with `only` loads a subset.
  auto unexpected = run(world, [&](Comm& comm) -> Status {
    Model full(comm.rank(), world);
    StateDict sd(comm.rank());
    for (const TensorEntry& e : full.state.tensors())
      if (e.name != "bias") EXPECT_TRUE(sd.add_tensor(e.name, e.dtype, e.buffers, e.layout).ok());
    return load(comm, sd, root() + "/ck", {}).status();
  });
  expect_all_equal(unexpected, "1 tensor(s) the state dict has no place for: 'bias'");
  auto allowed = run(world, [&](Comm& comm) -> Status {
    Model full(comm.rank(), world);
    StateDict sd(comm.rank());
    for (const TensorEntry& e : full.state.tensors())
      if (e.name != "bias") EXPECT_TRUE(sd.add_tensor(e.name, e.dtype, e.buffers, e.layout).ok());
    LoadOptions opts;
    opts.allow_unexpected = true;
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, sd, root() + "/ck", opts));
    EXPECT_EQ(r.unexpected_in_checkpoint, std::vector<std::string>{"bias"});
    LoadOptions subset;
    subset.only = {sd.tensors().front().name};
    return load(comm, sd, root() + "/ck", subset).status();
  });
  expect_all_equal(allowed, "ok");
  // dtype mismatch.
  auto dtype = run(world, [&](Comm& comm) {
    StateDict sd(comm.rank());
    std::vector<double> buf(5);
    auto l = TensorLayout::from_device_matrix({5}, {comm.size()}, {-1});
    EXPECT_TRUE(sd.add_tensor("bias", DType::kFloat64, buf.data(), *l).ok());
    return load(comm, sd, root() + "/ck", {}).status();
  });
  expect_all_equal(dtype, "dtype float64 in the state dict, float32 in the checkpoint");
  // Global shape mismatch.
  auto shape = run(world, [&](Comm& comm) {
    StateDict sd(comm.rank());
    std::vector<float> buf(6);
    auto l = TensorLayout::from_device_matrix({6}, {comm.size()}, {-1});
    EXPECT_TRUE(sd.add_tensor("bias", DType::kFloat32, buf.data(), *l).ok());
    return load(comm, sd, root() + "/ck", {}).status();
  });
  expect_all_equal(shape, "global shape [0:6] in the state dict, [0:5] in the checkpoint");
  // Partial load by name.
  auto partial = run(world, [&](Comm& comm) -> Status {
    Model m(comm.rank(), world);
    m.zero();
    LoadOptions opts;
    opts.only = {"bias"};
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, m.state, root() + "/ck", opts));
    EXPECT_EQ(r.loaded, std::vector<std::string>{"bias"});
    EXPECT_EQ(r.unexpected_in_checkpoint.size(), m.state.tensors().size() - 1);
    return Status();
  });
  expect_all_equal(partial, "ok");
}

// Ranks agree on a fingerprint of their state dicts before rank 0 plans for all; when
// one rank differs, every rank gets the same error naming it and the tensor, nothing is
// written, and the ranks that agreed are not blamed.
// MindSpore 2.x's load filters and a rename map: filters see stored names, renames come
// after them, and every refusal is the same on every rank.
TEST_P(LocalCheckpointTest, FiltersAndRenamesSelectWhatLoads) {
  expect_all_equal(run(world(), [&](Comm& comm) { return save_model(comm, "ck"); }), "ok");
  // The stored 'bias' loaded into a renamed module's 'model.bias'; nothing else asked.
  auto renamed = run(world(), [&](Comm& comm) -> Status {
    const Model expected(comm.rank(), comm.size());
    const int tp = comm.size() % 2 == 0 ? 2 : 1;
    auto layout = TensorLayout::from_device_matrix({5}, {comm.size() / tp, tp}, {-1});
    std::vector<unsigned char> buf(expected.buffers.back().size(), 0);
    StateDict sd(comm.rank());
    EXPECT_TRUE(sd.add_tensor("model.bias", DType::kFloat32, buf.data(), *layout).ok());
    LoadOptions opts;
    opts.specify_prefix = {"bias"};
    opts.rename = {{"bias", "model.bias"}};
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, sd, root() + "/ck", opts));
    EXPECT_EQ(buf, expected.buffers.back());
    EXPECT_EQ(r.loaded, std::vector<std::string>{"model.bias"});
    EXPECT_TRUE(r.unexpected_in_checkpoint.empty());
    EXPECT_EQ(r.filtered_out.size(), std::size(kAllDTypes));  // every p.<dtype>
    return Status();
  });
  expect_all_equal(renamed, "ok");
  // Excluded by a filter: missing, and strict says why.
  auto excluded = run(world(), [&](Comm& comm) -> Status {
    Model m(comm.rank(), comm.size());
    LoadOptions opts;
    opts.filter_prefix = {"bias"};
    return load(comm, m.state, root() + "/ck", opts).status();
  });
  expect_all_equal(excluded, "tensor 'bias' is not in checkpoint");
  EXPECT_NE(excluded[0].find("filters and renames"), std::string::npos) << excluded[0];
  // choice_func runs last, on stored names; non-strict reports what was left out.
  auto chosen = run(world(), [&](Comm& comm) -> Status {
    Model m(comm.rank(), comm.size());
    LoadOptions opts;
    opts.strict = false;
    opts.filter_prefix = {"bias"};
    opts.choice_func = [](const std::string& name) { return name.find("int") != std::string::npos; };
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, m.state, root() + "/ck", opts));
    for (const auto& name : r.loaded) EXPECT_NE(name.find("int"), std::string::npos) << name;
    EXPECT_FALSE(r.loaded.empty());
    EXPECT_EQ(r.loaded.size() + r.missing_in_checkpoint.size(), m.state.tensors().size());
    EXPECT_EQ(r.filtered_out.size(), r.missing_in_checkpoint.size());
    return Status();
  });
  expect_all_equal(chosen, "ok");
  // Refused: overlapping prefixes, two stored tensors renamed to one name.
  auto overlap = run(world(), [&](Comm& comm) -> Status {
    Model m(comm.rank(), comm.size());
    LoadOptions opts;
    opts.specify_prefix = {"p."};
    opts.filter_prefix = {"p.float"};
    return load(comm, m.state, root() + "/ck", opts).status();
  });
  expect_all_equal(overlap, "specify_prefix 'p.' and filter_prefix 'p.float' overlap");
  auto duplicate = run(world(), [&](Comm& comm) -> Status {
    Model m(comm.rank(), comm.size());
    LoadOptions opts;
    opts.rename_func = [](const std::string& name) { return name.rfind("p.", 0) == 0 ? std::string("p.x") : name; };
    return load(comm, m.state, root() + "/ck", opts).status();
  });
  expect_all_equal(duplicate, "would both be loaded as 'p.x'");
}

// fp32 weights into a bf16 (and a float64) model, only when asked; integers never.
TEST_P(LocalCheckpointTest, FloatCastsOnlyWhenAsked) {
  expect_all_equal(run(world(), [&](Comm& comm) { return save_model(comm, "ck"); }), "ok");
  auto refused = run(world(), [&](Comm& comm) -> Status {
    const Model saved(comm.rank(), comm.size());
    const TensorEntry& f32 = saved.state.tensors()[static_cast<std::size_t>(saved.state.find("p.float32"))];
    std::vector<uint16_t> bf16(static_cast<std::size_t>(f32.boxes[0].num_elements()));
    StateDict sd(comm.rank());
    EXPECT_TRUE(sd.add_tensor("p.float32", DType::kBFloat16, bf16.data(), f32.layout).ok());
    return load(comm, sd, root() + "/ck", {}).status();
  });
  expect_all_equal(refused, "cast_floats");
  auto cast = run(world(), [&](Comm& comm) -> Status {
    const Model saved(comm.rank(), comm.size());
    const TensorEntry& f32 = saved.state.tensors()[static_cast<std::size_t>(saved.state.find("p.float32"))];
    const TensorEntry& f16 = saved.state.tensors()[static_cast<std::size_t>(saved.state.find("p.float16"))];
    const auto n32 = static_cast<std::size_t>(f32.boxes[0].num_elements());
    const auto n16 = static_cast<std::size_t>(f16.boxes[0].num_elements());
    std::vector<uint16_t> bf16(n32), want_bf16(n32);
    std::vector<double> f64(n16), want_f64(n16);
    internal_transform::cast_floats(f32.buffers[0], DType::kFloat32, want_bf16.data(), DType::kBFloat16, n32);
    internal_transform::cast_floats(f16.buffers[0], DType::kFloat16, want_f64.data(), DType::kFloat64, n16);
    StateDict sd(comm.rank());
    EXPECT_TRUE(sd.add_tensor("p.float32", DType::kBFloat16, bf16.data(), f32.layout).ok());
    EXPECT_TRUE(sd.add_tensor("p.float16", DType::kFloat64, f64.data(), f16.layout).ok());
    LoadOptions opts;
    opts.strict = false;
    opts.allow_unexpected = true;  // two of the model's tensors
    opts.cast_floats = true;
    DISTCKPT_ASSIGN_OR_RETURN(auto r, load(comm, sd, root() + "/ck", opts));
    EXPECT_EQ(bf16, want_bf16);
    EXPECT_EQ(std::memcmp(f64.data(), want_f64.data(), n16 * sizeof(double)), 0);
    EXPECT_EQ(r.loaded.size(), 2u);
    return Status();
  });
  expect_all_equal(cast, "ok");
  auto integers = run(world(), [&](Comm& comm) -> Status {
    const Model saved(comm.rank(), comm.size());
    const TensorEntry& i32 = saved.state.tensors()[static_cast<std::size_t>(saved.state.find("p.int32"))];
    std::vector<float> f(static_cast<std::size_t>(i32.boxes[0].num_elements()));
    StateDict sd(comm.rank());
    EXPECT_TRUE(sd.add_tensor("p.int32", DType::kFloat32, f.data(), i32.layout).ok());
    LoadOptions opts;
    opts.cast_floats = true;
    return load(comm, sd, root() + "/ck", opts).status();
  });
  expect_all_equal(integers, "dtype float32 in the state dict, int32 in the checkpoint");
}

TEST_P(LocalCheckpointTest, StateDictsThatDifferAcrossRanksAreNamed) {
  const int world = this->world();
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  const int odd = world - 1;
  for (bool integrated : {false, true}) {
    auto statuses = run(world, [&](Comm& comm) {
      Model m(comm.rank(), world);
      std::vector<float> f(3);
      std::vector<double> d(3);
      auto l = TensorLayout::from_device_matrix({3}, {comm.size()}, {-1});
      if (comm.rank() == odd) EXPECT_TRUE(m.state.add_tensor("extra", DType::kFloat64, d.data(), *l).ok());
      else EXPECT_TRUE(m.state.add_tensor("extra", DType::kFloat32, f.data(), *l).ok());
      SaveOptions opts = options(integrated ? "integrated" : "sharded");
      if (integrated) opts.integrated = true;
      return save(comm, m.state, root(), opts).status();
    });
    expect_all_equal(statuses, "rank " + std::to_string(odd) + ": tensor 'extra': dtype float64 but rank 0 has float32");
  }
  // A layout that names other ranks on one rank only.
  auto layouts = run(world, [&](Comm& comm) {
    Model m(comm.rank(), world);
    std::vector<float> buf(4);
    auto l = comm.rank() == odd ? TensorLayout::from_device_matrix({4}, {1}, {-1}, {odd})
                                : TensorLayout::from_device_matrix({4}, {1}, {-1}, {0});
    const bool member = comm.rank() == odd || comm.rank() == 0;
    EXPECT_TRUE(m.state.add_tensor("owned", DType::kFloat32, member ? buf.data() : nullptr, *l).ok());
    return save(comm, m.state, root(), options("layouts")).status();
  });
  expect_all_equal(layouts, "rank " + std::to_string(odd) + ": tensor 'owned': layout differs from rank 0's");
  EXPECT_FALSE(fs::exists(root() + "/sharded"));
  EXPECT_FALSE(fs::exists(root() + "/integrated"));
  EXPECT_FALSE(fs::exists(root() + "/layouts"));
}

// The opening of a save asks every question in one allreduce (agree_to_open); its
// answers stay apart: incremental on one rank only is named as such, and a rank whose
// own checks fail is reported before state dicts that also differ.
TEST_P(LocalCheckpointTest, OpeningQuestionsAreToldApart) {
  const int world = this->world();
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  const int odd = world - 1;
  expect_all_equal(run(world, [&](Comm& comm) {
                     Model m(comm.rank(), world);
                     SaveOptions opts = options("incremental");
                     opts.incremental = comm.rank() == odd;
                     return save(comm, m.state, root(), opts).status();
                   }),
                   "save 'incremental': incremental must be the same on every rank");
  const auto statuses = run(world, [&](Comm& comm) {
    Model m(comm.rank(), world);
    std::vector<float> extra(3);
    auto l = TensorLayout::from_device_matrix({3}, {comm.size()}, {-1});
    if (comm.rank() == 0) EXPECT_TRUE(m.state.add_tensor("extra", DType::kFloat32, extra.data(), *l).ok());
    SaveOptions opts = options(comm.rank() == odd ? "not/one" : "checks");
    return save(comm, m.state, root(), opts).status();
  });
  expect_all_equal(statuses, "save: rank " + std::to_string(odd) + ":");
  EXPECT_EQ(statuses[0].find("differ"), std::string::npos) << statuses[0];
  EXPECT_FALSE(fs::exists(root() + "/incremental"));
  EXPECT_FALSE(fs::exists(root() + "/checks"));
}

// Checksums off (to measure their cost): recorded as "none", loads check nothing, and
// one rank keeping them on keeps them on for all (the index never claims CRCs a writer
// did not compute).
TEST_P(LocalCheckpointTest, ChecksumsOffAreRecordedAndAgreed) {
  const int world = this->world();
  for (bool one_keeps_them : {false, true}) {
    const std::string name = one_keeps_them ? "mixed" : "off";
    expect_all_equal(run(world, [&](Comm& comm) {
                       Model m(comm.rank(), world);
                       SaveOptions opts = options(name);
                       opts.checksum = one_keeps_them && comm.rank() == world - 1;
                       return save(comm, m.state, root(), opts).status();
                     }),
                     "ok");
    auto info = read_checkpoint_info(root() + "/" + name);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info->checksum, one_keeps_them ? Checksum::kCrc32c : Checksum::kNone);
    // Data nothing checks is verified and loaded only when the caller allows it.
    VerifyOptions unchecked;
    unchecked.allow_unchecked = true;
    EXPECT_EQ(verify_checkpoint(root() + "/" + name).status().code(),
              one_keeps_them ? StatusCode::kOk : StatusCode::kUnsupported);
    ASSERT_TRUE(verify_checkpoint(root() + "/" + name, unchecked).ok());
    if (!one_keeps_them)
      expect_all_equal(run(world, [&](Comm& comm) -> Status {
                         Model m(comm.rank(), world);
                         return load(comm, m.state, root() + "/" + name, {}).status();
                       }),
                       "records no checksums");
    expect_all_equal(run(world, [&](Comm& comm) -> Status {
                       Model m(comm.rank(), world);
                       const auto expected = m.snapshot();
                       m.zero();
                       LoadOptions lo;
                       lo.allow_unchecked = true;
                       auto loaded = load(comm, m.state, root() + "/" + name, lo);
                       DISTCKPT_RETURN_IF_ERROR(loaded.status());
                       EXPECT_EQ(loaded->warning.empty(), one_keeps_them) << loaded->warning;
                       EXPECT_EQ(m.buffers, expected);
                       return Status();
                     }),
                     "ok");
  }
}

TEST_P(LocalCheckpointTest, NewerIndexVersionIsRefused) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "ck"); }), "ok");
  const std::string index = root() + "/ck/index.pb";
  {
    std::fstream f(index, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t v = internal_format::kIndexFormatVersion + 1;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  expect_load_fails(world, root(), "newer than this build supports");
}

TEST_P(LocalCheckpointTest, ListingReportsInFlightAndBroken) {
  const int world = this->world();
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "ck"); }), "ok");
  fs::create_directories(root() + "/next.tmp-0123");
  fs::create_directories(root() + "/junk");
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 3u);
  EXPECT_EQ(listing->entries[0].state, EntryState::kCommitted);
  EXPECT_EQ(listing->entries[0].step, 10);
  EXPECT_EQ(listing->entries[0].epoch, 2);
  EXPECT_EQ(listing->entries[1].name, "junk");
  EXPECT_EQ(listing->entries[1].state, EntryState::kBroken);
  EXPECT_EQ(listing->entries[2].state, EntryState::kInFlight);
  // The in-flight directory is never loaded: resolve picks the committed one.
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/ck");
  // A damaged checkpoint that `latest` names is an error, not a silent fallback.
  expect_all_equal(run(world, [&](Comm& c) { return save_model(c, "newer"); }), "ok");
  {
    std::fstream f(root() + "/newer/index.pb", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.write("garbage", 7);
  }
  auto damaged = resolve_checkpoint(root());
  EXPECT_EQ(damaged.status().code(), StatusCode::kCorruption);
  EXPECT_NE(damaged.status().message().find("names 'newer', which is damaged"), std::string::npos)
      << damaged.status().message();
  EXPECT_TRUE(resolve_checkpoint(root() + "/ck").ok());
}

TEST_P(LocalCheckpointTest, ResumeTargetFollowsCommitsNotClocksOrSnapshots) {
  const int world = this->world();
  auto save_as = [&](const std::string& name, bool update_latest) {
    return run(world, [&](Comm& comm) {
      Model m(comm.rank(), comm.size());
      SaveOptions opts = options(name);
      opts.update_latest = update_latest;
      return save(comm, m.state, root(), opts).status();
    });
  };
  expect_all_equal(save_as("a", true), "ok");
  // A side snapshot is loadable by path but never becomes the resume target.
  expect_all_equal(save_as("snapshot", false), "ok");
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/a");
  expect_all_equal(save_as("b", true), "ok");
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/b");
  // A crash between the rename and the pointer update leaves `latest` one behind:
  // the newer commit still wins (it has the higher sequence number).
  {
    std::ofstream latest(root() + "/latest", std::ios::trunc);
    latest << "a\n";
  }
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/b");
  // The next save takes a number never handed out before (claimed atomically: two jobs
  // in one root never share one), above `latest`'s target and every committed one.
  expect_all_equal(save_as("c", true), "ok");
  EXPECT_EQ(*resolve_checkpoint(root()), root() + "/c");
  auto info_b = read_checkpoint_info(root() + "/b");
  auto info_c = read_checkpoint_info(root() + "/c");
  ASSERT_TRUE(info_b.ok() && info_c.ok());
  EXPECT_GT(info_c->commit_seq, info_b->commit_seq);
  EXPECT_TRUE(info_c->advances_latest);
}

// Two jobs (two groups of ranks) commit the same name under one root at once: one
// wins, the other fails with kAlreadyExists, no tmp directory is left behind, and the
// surviving checkpoint is intact.
TEST_P(LocalCheckpointTest, ConcurrentJobsSavingTheSameName) {
  const int world = this->world();
  for (int round = 0; round < 5; ++round) {
    const std::string name = "race" + std::to_string(round);
    std::vector<std::string> outcome(2);
    std::thread jobs[2];
    for (int job = 0; job < 2; ++job)
      jobs[job] = std::thread([&, job] {
        outcome[job] = run(world, [&](Comm& c) { return save_model(c, name, nullptr, static_cast<uint8_t>(job + 1)); })[0];
      });
    for (auto& j : jobs) j.join();
    const int wins = (outcome[0] == "ok") + (outcome[1] == "ok");
    EXPECT_EQ(wins, 1) << outcome[0] << " | " << outcome[1];
    for (const auto& o : outcome)
      if (o != "ok") EXPECT_NE(o.find("already exists"), std::string::npos) << o;
    EXPECT_TRUE(verify_checkpoint(root() + "/" + name).ok());
  }
  auto listing = list_checkpoints(root());
  ASSERT_TRUE(listing.ok());
  for (const auto& e : listing->entries) EXPECT_EQ(e.state, EntryState::kCommitted) << e.name << ": " << e.detail;
}

TEST_P(LocalCheckpointTest, KeepingReplicasWritesEveryCopy) {
  const int world = this->world();
  auto statuses = run(world, [&](Comm& comm) -> Status {
    Model m(comm.rank(), world);
    SaveOptions opts = options("full");
    opts.remove_redundancy = false;
    DISTCKPT_ASSIGN_OR_RETURN(auto r, save(comm, m.state, root(), opts));
    uint64_t held = 0;
    for (const auto& b : m.buffers) held += b.size();
    EXPECT_EQ(static_cast<int64_t>(r.bytes_written), comm.allreduce_one(static_cast<int64_t>(held), ReduceOp::kSum));
    const auto expected = m.snapshot();
    m.zero();
    DISTCKPT_RETURN_IF_ERROR(load(comm, m.state, root() + "/full", {}));
    EXPECT_EQ(m.buffers, expected);
    return Status();
  });
  expect_all_equal(statuses, "ok");
}

INSTANTIATE_TEST_SUITE_P(RanksAndIo, LocalCheckpointTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

// ---- pieces under 4 KiB: read exactly, batched ----

// A [64, 960] float32 tensor column-split at TP2 (x DP2), loaded onto layouts whose
// column pieces are 1,280 bytes (TP3), 768 (TP5), or boxes that divide nothing evenly:
// every piece is read exactly (bytes_read == bytes_needed); sieving reads more.
TEST(SmallPieces, ReshardsReadExactlyTheBytesTheyNeed) {
  testing::TempDir dir;
  const Shape shape{64, 960};
  auto value = [](int64_t flat) { return static_cast<float>(flat % 9973) * 0.5f + 1.0f; };
  // One rank's buffers for `layout`, filled with the expected values (or zeros).
  auto make = [&](const TensorLayout& layout, int rank, bool fill, std::vector<std::vector<float>>& bufs,
                  StateDict& state) -> Status {
    std::vector<void*> ptrs;
    for (const Box& b : layout.boxes_of(rank)) {
      std::vector<float> v(static_cast<std::size_t>(std::max<int64_t>(1, b.num_elements())), 0.0f);
      if (fill)
        for (int64_t r = 0; r < b.shape[0]; ++r)
          for (int64_t c = 0; c < b.shape[1]; ++c)
            v[static_cast<std::size_t>(r * b.shape[1] + c)] = value((b.offset[0] + r) * shape[1] + b.offset[1] + c);
      bufs.push_back(std::move(v));
    }
    for (auto& v : bufs) ptrs.push_back(v.data());
    return state.add_tensor("w", DType::kFloat32, ptrs, layout);
  };
  for (const auto& r : testing::run_ranks(4, [&](Comm& comm) -> Status {
         DISTCKPT_ASSIGN_OR_RETURN(auto layout, TensorLayout::from_device_matrix(shape, {2, 2}, {-1, 0}));
         std::vector<std::vector<float>> bufs;
         StateDict state(comm.rank());
         DISTCKPT_RETURN_IF_ERROR(make(layout, comm.rank(), true, bufs, state));
         SaveOptions o;
         o.name = "tp2";
         return save(comm, state, dir.path(), o).status();
       }))
    ASSERT_EQ(r, "ok");
  struct Target {
    std::string what;
    int world;
    std::function<Result<TensorLayout>()> layout;
  };
  const std::vector<Target> targets = {
      {"TP3", 3, [&] { return TensorLayout::from_device_matrix(shape, {3}, {-1, 0}); }},
      {"TP5", 5, [&] { return TensorLayout::from_device_matrix(shape, {5}, {-1, 0}); }},
      {"explicit boxes", 3, [&] {
         return TensorLayout::from_boxes(shape, {{Box{{0, 0}, {64, 333}}},
                                                 {Box{{0, 333}, {40, 367}}, Box{{40, 333}, {24, 367}}},
                                                 {Box{{0, 700}, {64, 260}}}});
       }}};
  for (const Target& t : targets)
    for (bool sieve : {false, true}) {
      SCOPED_TRACE(t.what + (sieve ? ", sieving" : ", exact"));
      std::vector<LoadResult> results(static_cast<std::size_t>(t.world));
      for (const auto& r : testing::run_ranks(t.world, [&](Comm& comm) -> Status {
             DISTCKPT_ASSIGN_OR_RETURN(auto layout, t.layout());
             std::vector<std::vector<float>> got, want;
             StateDict state(comm.rank()), expected(comm.rank());
             DISTCKPT_RETURN_IF_ERROR(make(layout, comm.rank(), false, got, state));
             DISTCKPT_RETURN_IF_ERROR(make(layout, comm.rank(), true, want, expected));
             LoadOptions lo;
             lo.sieve_small_runs = sieve;
             DISTCKPT_ASSIGN_OR_RETURN(results[static_cast<std::size_t>(comm.rank())],
                                       load(comm, state, dir.path() + "/tp2", lo));
             return got == want ? Status() : internal_error("rank " + std::to_string(comm.rank()) + ": values differ");
           }))
        ASSERT_EQ(r, "ok");
      const LoadResult& l = results[0];
      EXPECT_GT(l.small_runs, 0u);
      EXPECT_EQ(l.bytes_needed, uint64_t{64} * 960 * 4);
      if (sieve) {
        EXPECT_EQ(l.small_reads, "sieving");
        EXPECT_GT(l.bytes_read, l.bytes_needed);
      } else {
        EXPECT_TRUE(l.small_reads == "io_uring" || l.small_reads == "pread") << l.small_reads;
        EXPECT_EQ(l.bytes_read, l.bytes_needed);
      }
    }
}

// ReadableFile::read_batch on a POSIX file: through io_uring where the kernel allows it,
// through preads when DISTCKPT_IO_URING=0 (read when a thread first batches), each with
// and without the bounce buffer (base/bounce.h: io_uring's batches are packed into it, as
// many pieces as it holds, a piece larger than it read alone); every way fills every
// request exactly, and a request past the end is reported as a truncation.
TEST(SmallPieces, BatchedReadsAreExactEitherWay) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/f";
  std::string bytes(1 << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 251);
  std::ofstream(path, std::ios::binary) << bytes;
  auto read_all = [&](std::string* method) -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(auto file, posix_filesystem()->open_readable(path));
    // Mostly pieces under 4 KiB, some of 20 KB (so that the bounce buffer fills before
    // the ring does), and one of 600 KiB, larger than the bounce buffer.
    std::vector<std::string> got(301);
    std::vector<ReadRequest> requests;
    const auto size_of = [](std::size_t i) { return i == 300 ? std::size_t{600} << 10 : i % 4 == 0 ? 20000 + i : 100 + i; };
    const auto offset_of = [](std::size_t i) { return i == 300 ? 1001 : i * 3001; };
    for (std::size_t i = 0; i < got.size(); ++i) {
      got[i].resize(size_of(i));
      requests.push_back(ReadRequest{got[i].data(), got[i].size(), offset_of(i)});
    }
    DISTCKPT_RETURN_IF_ERROR(file->read_batch(requests));
    *method = std::string(file->batch_method());
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != bytes.substr(offset_of(i), size_of(i))) return internal_error("request " + std::to_string(i) + " differs");
    std::string tail(64, '\0');
    const ReadRequest past{tail.data(), tail.size(), bytes.size() - 10};
    Status st = file->read_batch({&past, 1});
    if (st.code() != StatusCode::kCorruption || st.message().find("truncated") == std::string::npos)
      return internal_error("a read past the end gave: " + st.to_string());
    return Status();
  };
  for (const bool bounce : {true, false}) {
    SCOPED_TRACE(bounce ? "bounced" : "not bounced");
    internal_base::force_bounce_io_for_testing(bounce);
    std::string method;
    Status st;
    std::thread([&] { st = read_all(&method); }).join();  // a thread of its own: its ring decides afresh
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(method == "io_uring" || method == "pread") << method;
    if (method == "pread") std::printf("io_uring is not available here: the default batch was preads\n");
    std::thread([&] {
      ::setenv("DISTCKPT_IO_URING", "0", 1);
      st = read_all(&method);
      ::unsetenv("DISTCKPT_IO_URING");
    }).join();
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(method, "pread");
  }
  internal_base::force_bounce_io_for_testing(std::nullopt);
}

}  // namespace
}  // namespace distckpt
