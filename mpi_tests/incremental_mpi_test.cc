// Incremental saves (SaveOptions::incremental): unchanged chunks referenced, not
// rewritten; loads and reshards through references; verify checks referenced files;
// retirement keeps exactly the referenced files; a referenced file that disappears
// fails the save cleanly; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "catalog/gc.h"
#include "catalog/references.h"
#include "catalog/retire.h"
#include "distckpt/distckpt.h"
#include "mpi_test_util.h"
#include "storage/fault_fs.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;
using testing::SharedTempDir;
using testing::world_rank;
using testing::world_size;

constexpr int kLayers = 6;
constexpr int64_t kRows = 8, kCols = 512;

std::unique_ptr<Comm> world_comm() { return make_mpi_comm(MPI_COMM_WORLD); }

// kLayers weights split by rows over TP (replicated over DP) and a replicated bias each.
struct Model {
  StateDict state{world_rank()};
  std::vector<std::vector<float>> bufs;
  std::vector<Box> boxes;

  explicit Model(int tp) {
    const int dp = world_size() / tp;
    bufs.reserve(2 * kLayers);
    for (int l = 0; l < kLayers; ++l) {
      add("layer" + std::to_string(l) + ".w", *TensorLayout::from_device_matrix({kRows, kCols}, {dp, tp}, {-1, 0}));
      add("layer" + std::to_string(l) + ".b", *TensorLayout::from_device_matrix({kCols}, {dp, tp}, {-1}));
    }
  }
  void add(const std::string& name, const TensorLayout& layout) {
    const Box box = layout.boxes_of(world_rank())[0];
    bufs.emplace_back(static_cast<std::size_t>(box.num_elements()));
    boxes.push_back(box);
    ASSERT_TRUE(state.add_tensor(name, DType::kFloat32, bufs.back().data(), layout).ok());
  }
  // Every element of tensor t a function of (version of t, global index).
  void fill(const std::vector<int>& version) {
    for (std::size_t t = 0; t < bufs.size(); ++t) {
      const Box& b = boxes[t];
      const int64_t cols = b.shape.size() == 2 ? kCols : 1;
      for (int64_t i = 0; i < b.num_elements(); ++i) {
        const int64_t g = b.shape.size() == 2 ? (b.offset[0] + i / b.shape[1]) * cols + b.offset[1] + i % b.shape[1]
                                              : b.offset[0] + i;
        bufs[t][static_cast<std::size_t>(i)] = static_cast<float>(g * 3 + t * 1000 + version[t] * 100000);
      }
    }
  }
  void clear() {
    for (auto& b : bufs) std::fill(b.begin(), b.end(), -1.0f);
  }
};

std::vector<std::string> data_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("data-", 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

int tp_of_world() { return world_size() % 2 == 0 ? 2 : 1; }

SaveOptions incremental(const std::string& name, const std::string& base = "") {
  SaveOptions o;
  o.name = name;
  o.incremental = true;
  o.incremental_base = base;
  o.fsync = false;
  return o;
}

uint64_t state_bytes() { return uint64_t{kLayers} * (kRows * kCols + kCols) * sizeof(float); }
uint64_t weight_bytes() { return uint64_t{kRows * kCols} * sizeof(float); }
uint64_t bias_bytes() { return uint64_t{kCols} * sizeof(float); }

void expect_loads(Comm& comm, const std::string& path, const std::vector<int>& version) {
  Model want(tp_of_world()), got(tp_of_world());
  want.fill(version);
  got.clear();
  auto loaded = load(comm, got.state, path, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  for (std::size_t t = 0; t < want.bufs.size(); ++t) ASSERT_EQ(got.bufs[t], want.bufs[t]) << "tensor " << t;
}

// Each test: a shared directory, the world's communicator, and the model filled with
// version 0 of every tensor.
class IncrementalMpiTest : public ::testing::Test {
 protected:
  IncrementalMpiTest() { m.fill(version); }
  SharedTempDir tmp;
  std::unique_ptr<Comm> comm = world_comm();
  Model m{tp_of_world()};
  std::vector<int> version = std::vector<int>(2 * kLayers, 0);
};

TEST_F(IncrementalMpiTest, UnchangedChunksAreReferencedAndLoadVerifyAndReshard) {
  auto first = save(*comm, m.state, tmp.path(), incremental("step-1"));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->bytes_written, state_bytes());  // no base yet
  EXPECT_EQ(first->bytes_referenced, 0u);

  // Layers 0 and 1 change (weights and biases); the rest is frozen.
  for (int t : {0, 1, 2, 3}) version[static_cast<std::size_t>(t)] = 1;
  m.fill(version);
  auto second = save(*comm, m.state, tmp.path(), incremental("step-2"));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  const uint64_t changed = 2 * (weight_bytes() + bias_bytes());
  EXPECT_EQ(second->bytes_written, changed);
  EXPECT_EQ(second->bytes_referenced, state_bytes() - changed);
  EXPECT_EQ(second->incremental_base, "step-1");
  expect_loads(*comm, tmp.path() + "/step-2", version);
  expect_loads(*comm, tmp.path() + "/step-1", std::vector<int>(2 * kLayers, 0));

  // verify reads the referenced files too.
  if (world_rank() == 0) {
    auto report = verify_checkpoint(tmp.path() + "/step-2");
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    // step-2 holds only the files of the ranks that wrote changed chunks.
    EXPECT_LT(data_files(tmp.path() + "/step-2").size(), data_files(tmp.path() + "/step-1").size() + 1);
    EXPECT_GE(report->bytes_checked, state_bytes()) << "verify reads referenced chunks too";
  }

  // A third save changes nothing: it writes nothing, and its references are flattened
  // (step-1's files directly, never step-2's references of them).
  auto third = save(*comm, m.state, tmp.path(), incremental("step-3"));
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(third->bytes_written, 0u);
  EXPECT_EQ(third->bytes_referenced, state_bytes());
  expect_loads(*comm, tmp.path() + "/step-3", version);

  // Loaded onto another layout: every rank holds everything (world 1 x 1 per rank).
  {
    StateDict whole(world_rank());
    std::vector<std::vector<float>> bufs(2 * kLayers);
    for (int l = 0; l < kLayers; ++l) {
      bufs[2 * l].resize(kRows * kCols);
      bufs[2 * l + 1].resize(kCols);
      ASSERT_TRUE(whole.add_tensor("layer" + std::to_string(l) + ".w", DType::kFloat32, bufs[2 * l].data(),
                                   *TensorLayout::from_device_matrix({kRows, kCols}, {world_size()}, {-1, -1})).ok());
      ASSERT_TRUE(whole.add_tensor("layer" + std::to_string(l) + ".b", DType::kFloat32, bufs[2 * l + 1].data(),
                                   *TensorLayout::from_device_matrix({kCols}, {world_size()}, {-1})).ok());
    }
    auto loaded = load(*comm, whole, tmp.path() + "/step-3", {});
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    EXPECT_EQ(bufs[0][5], static_cast<float>(5 * 3 + 0 * 1000 + 1 * 100000));
    EXPECT_EQ(bufs[10][7], static_cast<float>(7 * 3 + 10 * 1000 + 0 * 100000));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(IncrementalMpiTest, RetirementKeepsExactlyTheReferencedFiles) {
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  version[0] = 1;  // one weight changes
  m.fill(version);
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-2")).ok());
  auto& posix = *posix_filesystem();
  if (world_rank() == 0) {
    ASSERT_TRUE(internal_catalog::retire_checkpoint(posix, tmp.path(), "step-1").ok());
    auto listing = list_checkpoints(tmp.path());
    ASSERT_TRUE(listing.ok());
    bool retired = false;
    for (const auto& e : listing->entries)
      if (e.name == "step-1") {
        retired = true;
        EXPECT_EQ(e.state, EntryState::kRetired) << e.detail;
        EXPECT_GT(e.bytes, 0u);
      }
    EXPECT_TRUE(retired);
    // gc --dry-run: kept, since step-2 references its files.
    internal_catalog::GcOptions dry;
    dry.dry_run = true;
    auto would = internal_catalog::collect_garbage(posix, tmp.path(), dry);
    ASSERT_TRUE(would.ok());
    EXPECT_TRUE(would->removed.empty());
    bool kept = false;
    for (const auto& e : would->kept) kept |= e.name == "step-1";
    EXPECT_TRUE(kept);
    // Not a checkpoint any more: not resolved, not loadable by name.
    EXPECT_EQ(*resolve_checkpoint(tmp.path()), tmp.path() + "/step-2");
    EXPECT_FALSE(fs::exists(tmp.path() + "/step-1/index.pb"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_loads(*comm, tmp.path() + "/step-2", version);
  if (world_rank() == 0) ASSERT_TRUE(verify_checkpoint(tmp.path() + "/step-2").ok());
  MPI_Barrier(MPI_COMM_WORLD);

  // Everything changes: step-3 references nothing; once step-2 is retired nothing
  // references step-1's files and both go entirely.
  for (auto& v : version) v = 2;
  m.fill(version);
  auto third = save(*comm, m.state, tmp.path(), incremental("step-3"));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->bytes_referenced, 0u);
  if (world_rank() == 0) {
    ASSERT_TRUE(internal_catalog::retire_checkpoint(posix, tmp.path(), "step-2").ok());
    EXPECT_FALSE(fs::exists(tmp.path() + "/step-2"));
    EXPECT_TRUE(fs::exists(tmp.path() + "/step-1"));  // retired earlier: the next sweep frees it
    // A dry run (gc --dry-run) says so and touches nothing.
    internal_catalog::GcOptions dry;
    dry.dry_run = true;
    auto would = internal_catalog::collect_garbage(posix, tmp.path(), dry);
    ASSERT_TRUE(would.ok());
    ASSERT_EQ(would->removed.size(), 1u);
    EXPECT_EQ(would->removed[0].name, "step-1");
    EXPECT_FALSE(would->removed[0].removed);
    EXPECT_TRUE(fs::exists(tmp.path() + "/step-1"));
    auto swept = internal_catalog::sweep_retired(posix, tmp.path());
    ASSERT_TRUE(swept.ok());
    EXPECT_EQ(swept->removed, std::vector<std::string>{"step-1"});
    EXPECT_FALSE(fs::exists(tmp.path() + "/step-1"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_loads(*comm, tmp.path() + "/step-3", version);
}

TEST_F(IncrementalMpiTest, AnInFlightSavesReferencesKeepFilesOfARetiredBase) {
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  if (world_rank() == 0) {
    auto& posix = *posix_filesystem();
    // A save in flight (another job, or an async save) took step-1 as its base: it marked
    // it and listed its files, as prepare_base does.
    const std::vector<std::string> names = data_files(tmp.path() + "/step-1");
    ASSERT_FALSE(names.empty());
    const std::string in_flight = tmp.path() + "/step-9.tmp-00000000000000aa";
    fs::create_directories(in_flight);
    std::set<std::string> files;
    for (const auto& f : names) files.insert(internal_catalog::reference_key("step-1", f));
    ASSERT_TRUE(internal_catalog::mark_referenced(posix, tmp.path(), "step-1").ok());
    ASSERT_TRUE(internal_catalog::write_references(posix, in_flight, files, false).ok());
    ASSERT_TRUE(internal_catalog::retire_checkpoint(posix, tmp.path(), "step-1").ok());
    for (const auto& f : names) EXPECT_TRUE(fs::exists(tmp.path() + "/step-1/" + f)) << f;
    // The in-flight save is abandoned: its entry goes, and then the files.
    fs::remove_all(in_flight);
    auto swept = internal_catalog::sweep_retired(posix, tmp.path());
    ASSERT_TRUE(swept.ok());
    EXPECT_FALSE(fs::exists(tmp.path() + "/step-1"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(IncrementalMpiTest, AReferencedFileThatDisappearsFailsTheSaveCleanly) {
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  const std::string victim_name = data_files(tmp.path() + "/step-1").at(0);
  const std::string victim = tmp.path() + "/step-1/" + victim_name;
  // Something that ignores the protocol (a user's rm) removes a file the save will
  // reference, after the save listed it: the commit's check fails the save on every rank.
  internal_storage::FaultSpec spec;
  spec.hook = [&](const std::string& op, const std::string& path) {
    if (world_rank() == 0 && op == "rename" && path.find("references") != std::string::npos && fs::exists(victim))
      fs::remove(victim);
  };
  SaveOptions o = incremental("step-2");
  o.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  auto saved = save(*comm, m.state, tmp.path(), o);
  ASSERT_FALSE(saved.ok());
  EXPECT_NE(saved.status().message().find(victim_name), std::string::npos) << saved.status().to_string();
  if (world_rank() == 0) {
    EXPECT_FALSE(fs::exists(tmp.path() + "/step-2"));
    for (const auto& e : fs::directory_iterator(tmp.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(IncrementalMpiTest, AsyncSavesHashOnTheCallersThreadAndWriteOnlyWhatChanged) {
  auto async = make_async_checkpointer(MPI_COMM_WORLD, {});
  ASSERT_TRUE(async.ok()) << async.status().to_string();
  ASSERT_TRUE((*async)->save_async(m.state, tmp.path(), incremental("step-1")).ok());
  auto first = (*async)->wait();
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  version[2] = 1;  // layer 1's weight
  m.fill(version);
  ASSERT_TRUE((*async)->save_async(m.state, tmp.path(), incremental("step-2")).ok());
  // The buffers may change once save_async returned: the hashes and the bytes were taken.
  const std::vector<int> saved = version;
  version[4] = 7;
  m.fill(version);
  auto second = (*async)->wait();
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->bytes_written, weight_bytes());
  expect_loads(*comm, tmp.path() + "/step-2", saved);
}

TEST_F(IncrementalMpiTest, ReplacedOrRemovedBasesAreCaughtNotLoaded) {
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  version[0] = 1;
  m.fill(version);
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-2")).ok());
  if (world_rank() == 0) {
    // Framed as version 3: builds that do not know references refuse it ("upgrade").
    std::ifstream in(tmp.path() + "/step-2/index.pb", std::ios::binary);
    char header[12];
    in.read(header, sizeof(header));
    uint32_t v;
    std::memcpy(&v, header + 8, sizeof(v));
    EXPECT_EQ(v, 3u);
    // Another checkpoint under the base's name (moved away and saved again by hand): the
    // reference's identity no longer matches.
    fs::rename(tmp.path() + "/step-1", tmp.path() + "/moved");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  SaveOptions plain;
  plain.name = "step-1";
  plain.fsync = false;
  plain.update_latest = false;
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), plain).ok());
  Model got(tp_of_world());
  auto loaded = load(*comm, got.state, tmp.path() + "/step-2", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("is not the checkpoint this one references"), std::string::npos)
      << loaded.status().to_string();
  if (world_rank() == 0) {
    auto verified = verify_checkpoint(tmp.path() + "/step-2");
    ASSERT_FALSE(verified.ok());
    EXPECT_EQ(verified.status().code(), StatusCode::kCorruption);
    // ls says so too (the identity check verify and load make), and never calls it latest.
    auto replaced = list_checkpoints(tmp.path());
    ASSERT_TRUE(replaced.ok());
    for (const auto& e : replaced->entries)
      if (e.name == "step-2") EXPECT_EQ(e.state, EntryState::kBroken) << e.detail;
    // Removed by hand instead (rm -rf): ls says step-2 is damaged, resume refuses it.
    fs::remove_all(tmp.path() + "/step-1");
    auto listing = list_checkpoints(tmp.path());
    ASSERT_TRUE(listing.ok());
    for (const auto& e : listing->entries)
      if (e.name == "step-2") {
        EXPECT_EQ(e.state, EntryState::kBroken);
        EXPECT_NE(e.detail.find("missing"), std::string::npos) << e.detail;
      }
    EXPECT_EQ(resolve_checkpoint(tmp.path()).status().code(), StatusCode::kCorruption);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A damaged chunk in a referenced file is reported with that file's own path (the
// checkpoint that references it may have a file of the same name); a base that lost its
// index makes ls list what references it as damaged.
TEST_F(IncrementalMpiTest, DamageInABaseIsNamedWhereItIs) {
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  version[0] = 1;
  m.fill(version);
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-2")).ok());
  if (world_rank() == 0) {
    for (const auto& e : fs::directory_iterator(tmp.path() + "/step-1")) {
      if (e.path().filename().string().rfind("data-", 0) != 0) continue;
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      const auto size = static_cast<std::streamoff>(fs::file_size(e.path()));
      for (std::streamoff at = 0; at < size; at += 64) {  // inside every chunk, whatever the gaps
        f.seekp(at);
        f.put('\x5a');
      }
    }
    auto verified = verify_checkpoint(tmp.path() + "/step-2");
    ASSERT_EQ(verified.status().code(), StatusCode::kCorruption) << verified.status().to_string();
    EXPECT_NE(verified.status().message().find("/step-1/data-"), std::string::npos) << verified.status().to_string();
    EXPECT_NE(verified.status().message().find("(referenced)"), std::string::npos) << verified.status().to_string();
    fs::remove(tmp.path() + "/step-1/index.pb");
    auto listing = list_checkpoints(tmp.path());
    ASSERT_TRUE(listing.ok());
    bool seen = false;
    for (const auto& e : listing->entries)
      if (e.name == "step-2") {
        seen = true;
        EXPECT_EQ(e.state, EntryState::kBroken);
        EXPECT_NE(e.detail.find("no readable index"), std::string::npos) << e.detail;
      }
    EXPECT_TRUE(seen);
    EXPECT_EQ(resolve_checkpoint(tmp.path()).status().code(), StatusCode::kCorruption);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(IncrementalMpiTest, RemoveCheckpointKeepsWhatOthersReference) {
  SaveOptions full;
  full.name = "full";
  full.fsync = false;
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), full).ok());
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-1")).ok());
  version[0] = 1;
  m.fill(version);
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), incremental("step-2")).ok());
  if (world_rank() == 0) {
    // Never a base: removed whole, at once.
    ASSERT_TRUE(remove_checkpoint(tmp.path(), "full").ok());
    EXPECT_FALSE(fs::exists(tmp.path() + "/full"));
    // A base: retired, keeping what step-2 references.
    ASSERT_TRUE(remove_checkpoint(tmp.path(), "step-1").ok());
    EXPECT_TRUE(fs::exists(tmp.path() + "/step-1/index.retired"));
    EXPECT_EQ(remove_checkpoint(tmp.path(), "step-1").code(), StatusCode::kNotFound);
    EXPECT_EQ(remove_checkpoint(tmp.path(), "../x").code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(verify_checkpoint(tmp.path() + "/step-2").ok());
    // The name of a retired checkpoint that keeps files is taken, and the error says why.
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto again = save(*comm, m.state, tmp.path(), incremental("step-1"));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("retired"), std::string::npos) << again.status().to_string();
  expect_loads(*comm, tmp.path() + "/step-2", version);
}

TEST_F(IncrementalMpiTest, RefusalsAndBases) {
  // A base that is not there, when named.
  auto missing = save(*comm, m.state, tmp.path(), incremental("a", "nothing-here"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().to_string();
  // ... or a full save, when the base is only a hint (the manager's way).
  SaveOptions hint = incremental("hinted", "nothing-here");
  hint.incremental_base_required = false;
  auto hinted = save(*comm, m.state, tmp.path(), hint);
  ASSERT_TRUE(hinted.ok()) << hinted.status().to_string();
  EXPECT_EQ(hinted->bytes_written, state_bytes());
  EXPECT_NE(hinted->warning.find("was not used"), std::string::npos) << hinted->warning;
  // Encrypted, and other formats.
  SaveOptions enc = incremental("b");
  enc.encryption.mode = EncryptionMode::kAesGcm;
  enc.encryption.key = std::make_shared<EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, '\x07')));
  auto encrypted = save(*comm, m.state, tmp.path(), enc);
  ASSERT_FALSE(encrypted.ok());
  EXPECT_EQ(encrypted.status().code(), StatusCode::kInvalidArgument);
  SaveOptions ckpt = incremental("c");
  ckpt.format = Format::kCkpt;
  auto other = save(*comm, m.state, tmp.path(), ckpt);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  // A base saved without incremental records no hashes: everything is written, and
  // the save says why its named base was not used.
  SaveOptions plain;
  plain.name = "plain";
  plain.fsync = false;
  ASSERT_TRUE(save(*comm, m.state, tmp.path(), plain).ok());
  auto full = save(*comm, m.state, tmp.path(), incremental("d", "plain"));
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_EQ(full->bytes_referenced, 0u);
  EXPECT_NE(full->warning.find("no content hashes"), std::string::npos) << full->warning;
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace distckpt
