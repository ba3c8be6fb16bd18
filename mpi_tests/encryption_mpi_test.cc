// Encrypted checkpoints under mpirun: every mode round-trips through sharded, integrated
// and asynchronous saves and loads into another layout; a missing or wrong key, a
// modified chunk, two swapped chunks or a modified index is an authentication error
// naming what failed, identical on every rank; formats that cannot carry encryption
// refuse it; nothing readable of the tensors is left in the files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "distckpt/distckpt.h"
#include "mpi_test_util.h"

namespace distckpt {
namespace {

using testing::all_ranks;
using testing::SharedTempDir;
using testing::world_rank;
using testing::world_size;

// The value of element `g` of tensor `t`: a recognisable pattern.
uint8_t byte_at(int t, int64_t g, std::size_t k) { return static_cast<uint8_t>(0x41 + (g * 7 + t * 13 + k) % 26); }

// A model over DP x TP = world (TP = `tp`): a row-split matrix, a column-split int32
// matrix, a replicated bias of 9 bytes (CBC padding at an odd size) and an empty tensor.
struct Model {
  StateDict state{world_rank()};
  std::vector<std::vector<uint8_t>> bufs;

  Model(int tp, bool fill) {
    const int dp = world_size() / tp;
    add("w", DType::kFloat32, *TensorLayout::from_device_matrix({12, 10}, {dp, tp}, {0, -1}), 0, fill);
    add("c", DType::kInt32, *TensorLayout::from_device_matrix({5, 6}, {dp, tp}, {-1, 0}), 1, fill);
    add("bias", DType::kUInt8, *TensorLayout::from_device_matrix({9}, {dp, tp}, {-1}), 2, fill);
    add("empty", DType::kFloat32, *TensorLayout::from_device_matrix({0, 4}, {dp, tp}, {-1, -1}), 3, fill);
  }
  void add(const std::string& name, DType dt, const TensorLayout& layout, int t, bool fill) {
    const Box box = layout.boxes_of(world_rank())[0];
    const std::size_t item = dtype_size(dt);
    // (An empty box still needs a non-null buffer.)
    std::vector<uint8_t> b(std::max<std::size_t>(1, static_cast<std::size_t>(box.num_elements()) * item), 0);
    if (fill) {
      const Shape& g = layout.global_shape();
      for (int64_t i = 0; i < box.num_elements(); ++i) {
        int64_t global = box.offset[0] + i;
        if (box.shape.size() == 2)
          global = (box.offset[0] + i / box.shape[1]) * g[1] + box.offset[1] + i % box.shape[1];
        for (std::size_t k = 0; k < item; ++k) b[static_cast<std::size_t>(i) * item + k] = byte_at(t, global, k);
      }
    }
    bufs.push_back(std::move(b));
    const Status added = state.add_tensor(name, dt, bufs.back().data(), layout);
    ASSERT_TRUE(added.ok()) << added.to_string();
  }
  bool same_as(const Model& other) const { return bufs == other.bufs; }
};

std::shared_ptr<const EncryptionKey> key_of(std::size_t n, char fill) {
  return std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(n, fill)));
}

// The bytes of a file (rank 0's view; the directory is shared).
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every rank got the same error, of `code`, mentioning `needle`.
void expect_same_error(const Status& st, StatusCode code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  std::string mine = st.to_string(), zero = mine;
  int n = static_cast<int>(zero.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  zero.resize(static_cast<std::size_t>(n));
  MPI_Bcast(zero.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(all_ranks(zero == mine)) << "ranks disagree: " << mine;
}

struct ModeCase {
  EncryptionMode mode;
  std::size_t key_bytes;
};

class EncryptedModes : public ::testing::TestWithParam<ModeCase> {};

TEST_P(EncryptedModes, ShardedIntegratedAndAsyncRoundTripIntoAnotherLayout) {
  SharedTempDir tmp;
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  const int tp = world_size() % 2 == 0 ? 2 : 1;
  Model saved(tp, true);
  const auto key = key_of(GetParam().key_bytes, 'k');
  // 0 sharded, 1 integrated, 2 asynchronous, 3 an integrated .ckpt file.
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    SaveOptions so;
    so.name = "v" + std::to_string(variant);
    so.encryption = {GetParam().mode, key};
    if (variant == 1) so.integrated = true;
    if (variant == 3) {
      so.format = Format::kCkpt;
      so.ckpt_crc_footer = false;
    }
    Result<SaveResult> r = internal_error("not run");
    if (variant == 2) {
      AsyncOptions ao;
      ao.staging_bytes = ao.slab_bytes = 1 << 20;
      auto async = make_async_checkpointer(MPI_COMM_WORLD, ao);
      if (!async.ok()) {  // no MPI_THREAD_MULTIPLE here: covered by the sync variants
        EXPECT_EQ(async.status().code(), StatusCode::kUnsupported);
        continue;
      }
      ASSERT_TRUE((*async)->save_async(saved.state, tmp.path(), so).ok());
      r = (*async)->wait();
    } else {
      r = save(*comm, saved.state, tmp.path(), so);
    }
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (world_rank() == 0) {
      // No run of plaintext in any file, and no tensor name (a .ckpt is encrypted whole).
      std::vector<std::string> files;
      if (variant == 3) files.push_back(r->path);
      else
        for (const auto& e : std::filesystem::directory_iterator(r->path)) files.push_back(e.path());
      for (const auto& file : files) {
        const std::string bytes = read_all(file);
        EXPECT_EQ(bytes.find("bias"), std::string::npos) << file;
        EXPECT_EQ(bytes.find("ABCDEFGH"), std::string::npos) << file;
      }
      auto info = read_checkpoint_info(r->path);
      ASSERT_TRUE(info.ok()) << info.status().to_string();
      EXPECT_NE(info->encryption, "none");
      EXPECT_TRUE(info->tensors_sealed);
      EXPECT_TRUE(info->tensors.empty());
      VerifyOptions vo;
      vo.key = key;
      auto report = verify_checkpoint(r->path, vo);
      ASSERT_TRUE(report.ok()) << report.status().to_string();
      // MindSpore's CBC framing carries no MAC (its per-record CRC32Cs still check the bytes).
      EXPECT_EQ(report->authenticated, variant != 3 || GetParam().mode == EncryptionMode::kAesGcm);
      EXPECT_EQ(verify_checkpoint(r->path).status().code(), StatusCode::kAuthFailed);
    }
    // Into another layout: everything replicated (TP 1), so ranks read parts of chunks.
    Model loaded(1, false);
    LoadOptions lo;
    lo.key = key;
    auto l = load(*comm, loaded.state, r->path, lo);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    Model expected(1, true);
    EXPECT_TRUE(all_ranks(loaded.same_as(expected)));
    // And the same layout.
    Model again(tp, false);
    ASSERT_TRUE(load(*comm, again.state, r->path, lo).ok());
    EXPECT_TRUE(all_ranks(again.same_as(saved)));
    if (variant == 3) {  // a modified byte of the file: refused on every rank
      std::string original;
      if (world_rank() == 0) {
        original = read_all(r->path);
        std::string changed = original;
        changed[changed.size() / 2] ^= 0x01;
        write_all(r->path, changed);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      // AES-GCM: the block's tag. CBC decrypts to other bytes, which a CRC32C (a record's,
      // or the structure's) or the records' own framing catches.
      if (GetParam().mode == EncryptionMode::kAesGcm)
        expect_same_error(load(*comm, again.state, r->path, lo).status(), StatusCode::kAuthFailed,
                          "block 0: decryption failed");
      else
        expect_same_error(load(*comm, again.state, r->path, lo).status(), StatusCode::kCorruption, "v3.ckpt");
      if (world_rank() == 0) write_all(r->path, original);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EncryptedModes,
                         ::testing::Values(ModeCase{EncryptionMode::kAesGcm, 32}, ModeCase{EncryptionMode::kAesGcm, 16},
                                           ModeCase{EncryptionMode::kAesCbc, 24}, ModeCase{EncryptionMode::kSm4Cbc, 16}),
                         [](const auto& info) {
                           std::string name(encryption_mode_name(info.param.mode));
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name + std::to_string(info.param.key_bytes * 8);
                         });

TEST(EncryptionMpiTest, WrongMissingKeysTamperingAndSwapsFailOnEveryRank) {
  SharedTempDir tmp;
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  const int tp = world_size() % 2 == 0 ? 2 : 1;
  Model saved(tp, true);
  const auto key = key_of(32, 'k');
  SaveOptions so;
  so.name = "ck";
  so.encryption = {EncryptionMode::kAesGcm, key};
  auto r = save(*comm, saved.state, tmp.path(), so);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  LoadOptions lo;
  lo.key = key;

  Model m(tp, false);
  LoadOptions none;
  expect_same_error(load(*comm, m.state, r->path, none).status(), StatusCode::kAuthFailed, "its key is needed");
  LoadOptions wrong;
  wrong.key = key_of(32, 'w');
  expect_same_error(load(*comm, m.state, r->path, wrong).status(), StatusCode::kAuthFailed, "tensor table");
  LoadOptions short_key;
  short_key.key = key_of(16, 'k');
  expect_same_error(load(*comm, m.state, r->path, short_key).status(), StatusCode::kAuthFailed, "wrong key");

  // Tamper with one byte of a chunk of "w" (rank 0 owns the files' bytes here).
  CheckpointInfo info;
  if (world_rank() == 0) {
    auto opened = read_checkpoint_info(r->path, {nullptr, key});
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    info = *opened;
  }
  const std::string data0 = r->path + "/data-00000.bin";
  const std::string original = world_rank() == 0 ? read_all(data0) : std::string();
  if (world_rank() == 0) {
    std::string changed = original;
    const ChunkInfo& c = info.tensors[0].chunks[0];  // "w", chunk 0, written by rank 0
    ASSERT_EQ(c.file, "data-00000.bin");
    changed[c.byte_offset + c.length / 2] ^= 0x10;
    write_all(data0, changed);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_same_error(load(*comm, m.state, r->path, lo).status(), StatusCode::kAuthFailed, "tensor 'w': chunk 0");
  if (world_rank() == 0) {
    VerifyOptions vo;
    vo.key = key;
    const Status st = verify_checkpoint(r->path, vo).status();
    EXPECT_EQ(st.code(), StatusCode::kAuthFailed) << st.to_string();
    EXPECT_NE(st.message().find("tensor 'w': chunk 0"), std::string::npos) << st.to_string();
  }

  // Swap the bytes of two chunks of equal length (w's halves when TP=2 splits it), in
  // one file or across two: each then sits under the other's identity. (One rank: the
  // unit test covers another chunk's identity.)
  std::map<std::string, std::string> before;  // file -> original bytes
  const bool two_chunks = tp == 2;
  if (world_rank() == 0) {
    write_all(data0, original);
    const std::vector<ChunkInfo>& w = info.tensors[0].chunks;
    if (two_chunks) {
      ASSERT_EQ(w.size(), 2u);
      const ChunkInfo& a = w[0];
      const ChunkInfo& b = w[1];
      ASSERT_EQ(a.length, b.length);
      for (const ChunkInfo* c : {&a, &b}) before.emplace(c->file, read_all(r->path + "/" + c->file));
      std::map<std::string, std::string> after = before;
      after[a.file].replace(a.byte_offset, a.length, before[b.file].substr(b.byte_offset, b.length));
      after[b.file].replace(b.byte_offset, b.length, before[a.file].substr(a.byte_offset, a.length));
      for (const auto& [file, bytes] : after) write_all(r->path + "/" + file, bytes);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (two_chunks)
    expect_same_error(load(*comm, m.state, r->path, lo).status(), StatusCode::kAuthFailed, "authentication failed");

  // Restored, it loads again.
  if (world_rank() == 0) {
    write_all(data0, original);
    for (const auto& [file, bytes] : before) write_all(r->path + "/" + file, bytes);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_TRUE(load(*comm, m.state, r->path, lo).ok());
  EXPECT_TRUE(all_ranks(m.same_as(saved)));
}

TEST(EncryptionMpiTest, FormatsThatCannotCarryItRefuseAndRanksMustAgree) {
  SharedTempDir tmp;
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  Model saved(1, true);
  const auto key = key_of(32, 'k');
  for (Format f : {Format::kSafetensors, Format::kHdf5}) {  // (ckpt and native carry it)
    SaveOptions so;
    so.name = "f";
    so.format = f;
    so.encryption = {EncryptionMode::kAesGcm, key};
    expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument,
                      "cannot carry encryption");
  }
  // A key with mode none; ranks with different keys or modes, or some without a key.
  SaveOptions so;
  so.name = "n";
  so.encryption = {EncryptionMode::kNone, key};
  expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument, "mode none");
  so.encryption = {EncryptionMode::kSm4Cbc, nullptr};  // a mode other than the default, without its key
  expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument, "without a key");
  so.encryption = {EncryptionMode::kSm4Cbc, key};  // SM4 takes 16 bytes
  expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument, "16-byte key");
  if (world_size() > 1) {
    so.encryption = {EncryptionMode::kAesGcm, key_of(32, world_rank() == 1 ? 'x' : 'k')};
    expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument,
                      "same mode and key");
    so.encryption = {EncryptionMode::kAesGcm, world_rank() == 1 ? nullptr : key};
    expect_same_error(save(*comm, saved.state, tmp.path(), so).status(), StatusCode::kInvalidArgument,
                      "same mode and key");
  }
  EXPECT_TRUE(all_ranks(!std::filesystem::exists(tmp.path() + "/n")));
}

}  // namespace
}  // namespace distckpt
