// Single-file formats under mpirun: parallel HDF5 (each unique slice written by one
// rank as a hyperslab), ckpt and safetensors (gathered to a writer), every dtype,
// loaded back at the same world size into the other split (rows <-> columns) and on
// every rank as one replicated copy.
#include <gtest/gtest.h>

#include <filesystem>

#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/gather.h"
#include "distckpt/mpi_comm.h"
#include "format_model.h"
#include "mpi_test_util.h"

namespace distckpt {
namespace {

using testing::FormatModel;
using testing::SharedTempDir;

class FormatsMpi : public ::testing::TestWithParam<Format> {};

TEST_P(FormatsMpi, SaveThenLoadEveryDType) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  const int world = comm->size();
  SharedTempDir dir;
  FormatModel model(comm->rank(), world);
  SaveOptions options;
  options.name = "model";
  options.step = 12;
  options.epoch = 3;
  options.format = GetParam();
  options.gather_bytes = 64;
  options.writer_rank = world - 1;
  auto saved = save(*comm, model.state, dir.path(), options);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_EQ(saved->path.find(".tmp-"), std::string::npos);
  ASSERT_TRUE(testing::all_ranks(std::filesystem::exists(saved->path)));
  if (GetParam() == Format::kHdf5) EXPECT_EQ(saved->bytes_written, saved->bytes_unique);  // no replica written twice

  // Same world: every buffer comes back.
  FormatModel got(comm->rank(), world), want(comm->rank(), world);
  got.zero();
  auto loaded = load(*comm, got.state, saved->path, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->step, 12);
  EXPECT_EQ(std::get<std::string>(loaded->info.at("tag")), "hello");
  for (std::size_t i = 0; i < got.buffers.size(); ++i) EXPECT_EQ(got.buffers[i], want.buffers[i]) << i;

  // Every rank loads the whole first tensor, replicated: compare with gather_full.
  const TensorEntry& first = model.state.tensors()[0];
  std::vector<unsigned char> full(36 * dtype_size(first.dtype)), gathered(full.size());
  StateDict replicated(comm->rank());
  ASSERT_TRUE(replicated.add_tensor(first.name, first.dtype, full.data(),
                                    *TensorLayout::from_device_matrix({6, 6}, {world}, {-1, -1})).ok());
  LoadOptions one_tensor;
  one_tensor.allow_unexpected = true;  // the others are stored too
  ASSERT_TRUE(load(*comm, replicated, saved->path, one_tensor).ok());
  ASSERT_TRUE(gather_full(*comm, model.state, first.name, gathered.data()).ok());
  EXPECT_EQ(full, gathered);
  auto verified = verify_checkpoint(saved->path);
  EXPECT_TRUE(verified.ok()) << verified.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(All, FormatsMpi, ::testing::Values(Format::kHdf5, Format::kCkpt, Format::kSafetensors),
                         [](const auto& info) { return std::string(format_name(info.param)); });

}  // namespace
}  // namespace distckpt
