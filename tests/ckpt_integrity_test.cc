// Every byte of a .ckpt distckpt writes is checked: with MindSpore's footer or without it
// (each chunk's CRC32C and the structure's in field 1002), and in each file of a per-rank
// set (the set's chunk checksums, each file's CRC-32 and its own footer), and in an HDF5
// file (each dataset's CRC32C and the footer over its structure). Each byte is flipped
// in turn; verify and the one-process reader must refuse every flip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "distckpt/checkpoint.h"
#include "distckpt/inspect.h"
#include "format_model.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

using testing::FormatModel;
using testing::run_ranks;
using testing::TempDir;
namespace fs = std::filesystem;

// The HDF5 sweeps start the reader program for every flip: under AddressSanitizer each
// start costs a third of a second, so that leg flips a sparser sample (the plain build's
// sweep is the thorough one).
#ifdef __SANITIZE_ADDRESS__
constexpr std::size_t kHdf5Stride = 97;
#else
constexpr std::size_t kHdf5Stride = 29;
#endif

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

Status save_model(int world, const std::string& root, const SaveOptions& options) {
  for (const auto& r : run_ranks(world, [&](Comm& comm) -> Status {
         FormatModel m(comm.rank(), world, /*irregular=*/false);
         return save(comm, m.state, root, options).status();
       }))
    if (r != "ok") return internal_error(r);
  return Status();
}

// Flips one bit of each byte of `file` in turn; `checkpoint` (the file, or its set) must
// fail verify and, for a single file, the one-process load. Returns the offsets that passed.
std::vector<std::size_t> flips_that_pass(const std::string& checkpoint, const std::string& file, bool load_too,
                                         std::size_t stride = 1) {
  const std::string original = slurp(file);
  std::vector<std::size_t> passed;
  for (std::size_t i = 0; i < original.size(); i += stride) {
    std::string damaged = original;
    damaged[i] = static_cast<char>(damaged[i] ^ (1 << (i % 8)));
    put(file, damaged);
    bool caught = !verify_checkpoint(checkpoint).ok();
    if (load_too) caught = caught && !load_all(checkpoint).ok();
    if (!caught) {
      passed.push_back(i);
      ADD_FAILURE() << "byte " << i << " of " << original.size() << " (0x" << std::hex
                    << (static_cast<unsigned>(original[i]) & 0xff) << std::dec << "): verify "
                    << verify_checkpoint(checkpoint).status().to_string() << "; load "
                    << (load_too ? load_all(checkpoint).status().to_string() : "-");
    }
  }
  put(file, original);
  EXPECT_TRUE(verify_checkpoint(checkpoint).ok());
  return passed;
}

TEST(CkptIntegrity, EveryFlippedByteOfOurFileIsCaughtWithOrWithoutTheFooter) {
  for (bool footer : {true, false}) {
    SCOPED_TRACE(footer ? "footer" : "no footer (MindSpore's default)");
    TempDir dir;
    SaveOptions options;
    options.name = "m";
    options.format = Format::kCkpt;
    options.ckpt_crc_footer = footer;
    ASSERT_TRUE(save_model(2, dir.path(), options).ok());
    const std::string path = dir.path() + "/m.ckpt";
    auto report = verify_checkpoint(path);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_TRUE(report->warning.empty()) << report->warning;
    EXPECT_EQ(flips_that_pass(path, path, true), std::vector<std::size_t>{});
  }
}

// HDF5: each dataset's CRC32C is in the metadata attribute (rank 0 combines the ranks'
// parts), and distckpt's footer covers every other byte (HDF5 reads a file without
// checking its unused or older structures). One byte in kHdf5Stride is flipped, each bit
// in turn (verify and load start the HDF5 reader: all 13,000 bytes take minutes; a sweep
// of them all found none passing).
TEST(CkptIntegrity, FlippedBytesOfOurHdf5FileAreCaught) {
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(world));
    TempDir dir;
    SaveOptions options;
    options.name = "h";
    options.format = Format::kHdf5;
    ASSERT_TRUE(save_model(world, dir.path(), options).ok());
    const std::string path = dir.path() + "/h.h5";
    auto report = verify_checkpoint(path);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_TRUE(report->warning.empty()) << report->warning;
    if (world == 2) EXPECT_EQ(flips_that_pass(path, path, true, kHdf5Stride), std::vector<std::size_t>{});
  }
}

// An HDF5 file of info values and no dataset: its footer alone checks it, and a flip is
// caught.
TEST(CkptIntegrity, AnHdf5FileWithoutTensorsIsCheckedByItsFooter) {
  TempDir dir;
  SaveOptions options;
  options.name = "info";
  options.format = Format::kHdf5;
  for (const auto& r : run_ranks(2, [&](Comm& comm) -> Status {
         StateDict state(comm.rank());
         DISTCKPT_RETURN_IF_ERROR(state.set_info("lr", 0.5));
         return save(comm, state, dir.path(), options).status();
       }))
    ASSERT_EQ(r, "ok");
  const std::string path = dir.path() + "/info.h5";
  auto report = verify_checkpoint(path);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->warning.empty()) << report->warning;
  auto all = load_all(path);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(flips_that_pass(path, path, true, kHdf5Stride), std::vector<std::size_t>{});
}

TEST(CkptIntegrity, EveryFlippedByteOfAPerRankSetFileIsCaughtByVerify) {
  TempDir dir;
  SaveOptions options;
  options.name = "s";
  options.format = Format::kCkpt;
  options.integrated = false;
  ASSERT_TRUE(save_model(2, dir.path(), options).ok());
  const std::string set = dir.path() + "/s";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::string file = set + "/rank_" + std::to_string(r) + "/s.ckpt";
    ASSERT_TRUE(fs::exists(file));
    EXPECT_EQ(flips_that_pass(set, file, false), std::vector<std::size_t>{});
  }
}

}  // namespace
}  // namespace distckpt
