// load_all: a checkpoint's tensors into buffers the library allocates, without
// describing them first: whole on one process (no MPI), whole on every rank, or in the
// layout they were saved in; with the load's filters and renames; encrypted too.
#include <gtest/gtest.h>

#include <mutex>

#include "distckpt/checkpoint.h"
#include "format_model.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

using testing::expect_all_ok;
using testing::FormatModel;
using testing::full_tensor;
using testing::run_ranks;
using testing::TempDir;

// Every box of every tensor in `state` holds the FormatModel's bytes of that region.
void expect_model_bytes(const StateDict& state, const std::string& strip_prefix = "") {
  for (const TensorEntry& e : state.tensors()) {
    const std::string stored = e.name.substr(strip_prefix.size());
    const std::vector<unsigned char> full = full_tensor(stored);
    const Box whole = full_box(e.layout.global_shape());
    for (std::size_t b = 0; b < e.boxes.size(); ++b) {
      std::vector<unsigned char> expected(static_cast<std::size_t>(e.boxes[b].num_elements()) * dtype_size(e.dtype));
      copy_box(full.data(), whole, expected.data(), e.boxes[b], e.boxes[b], dtype_size(e.dtype));
      EXPECT_TRUE(expected.empty() || std::memcmp(e.buffers[b], expected.data(), expected.size()) == 0) << e.name << " box " << b;
    }
  }
}

class LoadAll : public ::testing::Test {
 protected:
  void SetUp() override {
    expect_all_ok(run_ranks(4, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 4);
      SaveOptions plain;
      plain.name = "plain";
      plain.step = 7;
      DISTCKPT_RETURN_IF_ERROR(save(comm, model.state, dir_.path(), plain).status());
      SaveOptions sealed = plain;
      sealed.name = "sealed";
      sealed.encryption = {EncryptionMode::kAesGcm, key_};
      DISTCKPT_RETURN_IF_ERROR(save(comm, model.state, dir_.path(), sealed).status());
      SaveOptions ckpt = plain;
      ckpt.name = "one";
      ckpt.format = Format::kCkpt;
      ckpt.integrated = true;
      return save(comm, model.state, dir_.path(), ckpt).status();
    }));
  }
  TempDir dir_;
  std::shared_ptr<const EncryptionKey> key_ =
      std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
};

TEST_F(LoadAll, OneProcessWholeTensorsFromAnyFormat) {
  const size_t tensors = FormatModel(0, 1).state.tensors().size();
  for (const std::string name : {"plain", "one.ckpt"}) {
    SCOPED_TRACE(name);
    auto all = load_all(dir_.path() + "/" + name);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    EXPECT_EQ(all->state.tensors().size(), tensors);
    EXPECT_EQ(all->step, 7);
    EXPECT_EQ(info_value_to_string(all->info.at("tag")), "hello");
    for (const TensorEntry& e : all->state.tensors()) EXPECT_EQ(e.boxes.size(), 1u) << e.name;
    expect_model_bytes(all->state);
    // Moved, the buffers stay where they were.
    LoadedCheckpoint moved = std::move(all).value();
    expect_model_bytes(moved.state);
  }
  // The root gives its newest; a key opens the encrypted one, its absence is refused.
  LoadOptions keyed;
  keyed.key = key_;
  auto sealed = load_all(dir_.path() + "/sealed", keyed);
  ASSERT_TRUE(sealed.ok()) << sealed.status().to_string();
  expect_model_bytes(sealed->state);
  EXPECT_EQ(load_all(dir_.path() + "/sealed").status().code(), StatusCode::kAuthFailed);
  LoadOptions only;
  only.only = {"bias"};
  EXPECT_EQ(load_all(dir_.path() + "/plain", only).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoadAll, CollectivelyWholeOrInTheStoredLayoutWithFiltersAndRenames) {
  // In the stored layout on 4 ranks: each rank holds what it held at save (device
  // matrix tensors exactly; the explicit one as its boxes were written).
  expect_all_ok(run_ranks(4, [&](Comm& comm) -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(LoadedCheckpoint all, load_all(comm, dir_.path() + "/plain", LoadAllLayout::kStored));
    FormatModel saved(comm.rank(), 4);
    for (const TensorEntry& e : saved.state.tensors()) {
      const int i = all.state.find(e.name);
      if (i < 0) return internal_error("missing " + e.name);
      const TensorEntry& got = all.state.tensors()[static_cast<std::size_t>(i)];
      if (e.layout.is_device_matrix() && got.boxes != e.boxes) return internal_error("boxes of " + e.name);
    }
    expect_model_bytes(all.state);
    return Status();
  }));
  // Too few ranks for the stored layout: refused alike everywhere.
  auto few = run_ranks(2, [&](Comm& comm) -> Status {
    return load_all(comm, dir_.path() + "/plain", LoadAllLayout::kStored).status();
  });
  for (const std::string& st : few) {
    EXPECT_EQ(st, few[0]);
    EXPECT_NE(st.find("needs at least 4 ranks"), std::string::npos) << st;
  }
  // Whole on every one of 3 ranks, only the layers, renamed into a module.
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    LoadOptions opts;
    opts.specify_prefix = {"layer"};
    opts.rename_func = [](const std::string& name) { return "model." + name; };
    DISTCKPT_ASSIGN_OR_RETURN(LoadedCheckpoint all, load_all(comm, dir_.path(), LoadAllLayout::kFull, opts));
    if (all.state.tensors().size() != std::size(kAllDTypes)) return internal_error("count");
    for (const TensorEntry& e : all.state.tensors())
      if (e.name.rfind("model.layer", 0) != 0 || e.boxes.size() != 1 || e.boxes[0] != full_box(e.layout.global_shape()))
        return internal_error("tensor " + e.name);
    expect_model_bytes(all.state, "model.");
    if (all.result.filtered_out.empty()) return internal_error("nothing filtered");
    return Status();
  }));
}

}  // namespace
}  // namespace distckpt
