// Resharding under mpirun: a checkpoint saved under one parallel layout is loaded into
// another (other DP x TP, other world size, row split vs column split, uneven and
// explicit-box splits), in every format, and every element is checked; a native load
// reads exactly the bytes it needs. Then the errors users meet when the model changed:
// a missing tensor (strict or not), another global shape (trailing dims of 1 excepted),
// another dtype.
//
// A layout over S ranks runs inside a world of W >= S ranks: ranks S..W-1 hold nothing
// of it (device-matrix layouts name their ranks), so one mpirun covers saves and loads
// on different numbers of ranks. Scenarios needing more ranks than the world are skipped.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/mpi_comm.h"
#include "mpi_test_util.h"

namespace distckpt {
namespace {

using testing::all_ranks;
using testing::SharedTempDir;
using testing::world_rank;
using testing::world_size;

// The value of element `global` (row-major index in the global tensor) of tensor `tid`:
// small integers, exact in float32 and int32.
int32_t value_of(int tid, int64_t global) { return static_cast<int32_t>((tid * 7919 + global * 31) % 65521) - 32000; }

// A parallel layout of the scenarios: DP x TP ranks (0 .. dp*tp-1), TP splitting
// `split_dim`. When TP does not divide it, part i is [i*d/TP, (i+1)*d/TP) (explicit boxes).
struct Parallel {
  int dp = 1, tp = 1, split_dim = 0;
  int ranks() const { return dp * tp; }
  std::string to_string() const {
    return "DP" + std::to_string(dp) + "xTP" + std::to_string(tp) + (split_dim == 0 ? "/rows" : "/cols");
  }
};

TensorLayout layout_for(const Shape& shape, const Parallel& p) {
  const int dim = std::min<int>(p.split_dim, static_cast<int>(shape.size()) - 1);
  if (shape[dim] % p.tp == 0) {
    Shape map(shape.size(), -1);
    map[dim] = 0;
    auto l = TensorLayout::from_device_matrix(shape, {p.dp, p.tp}, map);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return *l;
  }
  std::vector<std::vector<Box>> members(static_cast<std::size_t>(p.ranks()));
  for (int r = 0; r < p.ranks(); ++r) {
    const int part = r % p.tp;
    Box b = full_box(shape);
    b.offset[dim] = part * shape[dim] / p.tp;
    b.shape[dim] = (part + 1) * shape[dim] / p.tp - b.offset[dim];
    members[static_cast<std::size_t>(r)].push_back(b);
  }
  auto l = TensorLayout::from_boxes(shape, members);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return *l;
}

// Irregular: 6 boxes of [7, 5] dealt round-robin to `n` ranks, starting at rank `first`.
TensorLayout dealt(int n, int first) {
  const std::vector<Box> parts = {{{0, 0}, {3, 2}}, {{0, 2}, {3, 3}}, {{3, 0}, {1, 2}},
                                  {{3, 2}, {1, 3}}, {{4, 0}, {3, 2}}, {{4, 2}, {3, 3}}};
  std::vector<std::vector<Box>> members(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < parts.size(); ++i) members[(i + static_cast<std::size_t>(first)) % n].push_back(parts[i]);
  return *TensorLayout::from_boxes({7, 5}, members);
}

// One rank's tensors: buffers filled with value_of (or zeroed, to load into).
struct Model {
  struct Held {
    int tid;
    DType dtype;
    TensorLayout layout;
    std::vector<std::vector<char>> buffers;
  };
  std::vector<Held> held;
  StateDict state{world_rank()};

  void add(const std::string& name, int tid, DType dtype, const TensorLayout& layout, bool fill) {
    Held h{tid, dtype, layout, {}};
    std::vector<void*> ptrs;
    for (const Box& box : layout.boxes_of(world_rank())) {
      std::vector<char> b(std::max<std::size_t>(1, static_cast<std::size_t>(box.num_elements()) * 4), 0);
      if (fill) for_each(box, layout.global_shape(), [&](int64_t i, int64_t g) { put(b.data(), dtype, i, value_of(tid, g)); });
      h.buffers.push_back(std::move(b));
    }
    held.push_back(std::move(h));
    for (auto& b : held.back().buffers) ptrs.push_back(b.data());
    Status st = state.add_tensor(name, dtype, ptrs, layout);
    EXPECT_TRUE(st.ok()) << name << ": " << st.to_string();
  }
  // Elements that differ from value_of, over every tensor this rank holds.
  int64_t mismatches() const {
    int64_t bad = 0;
    for (const Held& h : held) {
      const auto boxes = h.layout.boxes_of(world_rank());
      for (std::size_t k = 0; k < boxes.size(); ++k)
        for_each(boxes[k], h.layout.global_shape(),
                 [&](int64_t i, int64_t g) { bad += get(h.buffers[k].data(), h.dtype, i) != value_of(h.tid, g); });
    }
    return bad;
  }

  template <typename F>
  static void for_each(const Box& box, const Shape& global_shape, F f) {
    for (int64_t i = 0; i < box.num_elements(); ++i) {
      int64_t global = 0, rem = i, stride = 1;
      for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
        global += (box.offset[d] + rem % box.shape[d]) * stride;
        rem /= box.shape[d];
        stride *= global_shape[d];
      }
      f(i, global);
    }
  }
  static void put(char* p, DType dt, int64_t i, int32_t v) {
    if (dt == DType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(p + i * 4, &f, 4);
    } else {
      std::memcpy(p + i * 4, &v, 4);
    }
  }
  static int32_t get(const char* p, DType dt, int64_t i) {
    if (dt == DType::kFloat32) {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return static_cast<int32_t>(f);
    }
    int32_t v;
    std::memcpy(&v, p + i * 4, 4);
    return v;
  }
};

// The tensors of every scenario. "big" has runs of at least 4 KiB under every split
// used here (6144 floats / 6), so its loads read exactly what they need.
void add_all(Model& m, const Parallel& p, int irregular_first, bool fill) {
  m.add("big", 0, DType::kFloat32, layout_for({16, 6144}, p), fill);
  m.add("w", 1, DType::kFloat32, layout_for({12, 12}, p), fill);
  m.add("odd", 2, DType::kInt32, layout_for({11, 6}, p), fill);  // uneven under TP 2, 3, 4, 6
  m.add("bias", 3, DType::kFloat32, layout_for({12}, Parallel{p.ranks(), 1, 0}), fill);  // replicated
  m.add("irregular", 4, DType::kInt32, dealt(p.ranks(), irregular_first), fill);
}

struct Scenario {
  Parallel save, load;
};

class ReshardMpi : public ::testing::TestWithParam<Format> {};

TEST_P(ReshardMpi, EveryLayoutPairLoadsEveryElement) {
  const Format format = GetParam();
  const int w = world_size();
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  std::vector<Scenario> scenarios = {
      {{2, 2, 0}, {1, 4, 0}},          // DP2xTP2 -> DP1xTP4
      {{2, 2, 0}, {1, 1, 0}},          // DP2xTP2 -> one rank
      {{1, 4, 0}, {1, 2, 0}},          // TP4 -> TP2 ("odd" uneven on both sides)
      {{1, w, 0}, {1, w, 1}},          // row split -> column split, whole world
      {{w, 1, 0}, {1, w, 1}},          // pure DP -> pure TP
      {{1, w, 0}, {1, std::max(1, w - 1), 1}},  // the world shrinks by one rank
      {{3, 2, 0}, {2, 3, 1}},          // DP3xTP2 rows -> DP2xTP3 columns
      {{1, 1, 0}, {2, w / 2 > 0 ? w / 2 : 1, 0}},  // one rank -> many
  };
  int ran = 0;
  for (std::size_t s = 0; s < scenarios.size(); ++s) {
    const Scenario& sc = scenarios[s];
    if (sc.save.ranks() > w || sc.load.ranks() > w) continue;  // needs a bigger world
    const std::string what = std::string(format_name(format)) + ": " + sc.save.to_string() + " -> " + sc.load.to_string();
    SharedTempDir dir;
    Model saved;
    add_all(saved, sc.save, 0, true);
    SaveOptions so;
    so.name = "c";
    so.format = format;
    auto r = save(*comm, saved.state, dir.path(), so);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().to_string();

    Model loaded;
    add_all(loaded, sc.load, 1, false);
    auto l = load(*comm, loaded.state, r->path, {});
    ASSERT_TRUE(l.ok()) << what << ": " << l.status().to_string();
    EXPECT_TRUE(all_ranks(loaded.mismatches() == 0)) << what;

    // Exactly the bytes needed: the byte ranges of partly needed chunks, no more.
    Model big;
    big.add("big", 0, DType::kFloat32, layout_for({16, 6144}, sc.load), false);
    LoadOptions only_big;
    only_big.strict = false;
    only_big.allow_unexpected = true;  // the model's other tensors are stored too
    auto b = load(*comm, big.state, r->path, only_big);
    ASSERT_TRUE(b.ok()) << what << ": " << b.status().to_string();
    EXPECT_EQ(b->bytes_read, b->bytes_needed) << what;
    EXPECT_GT(b->bytes_needed, 0u) << what;
    EXPECT_TRUE(all_ranks(big.mismatches() == 0)) << what;
    ++ran;
  }
  EXPECT_GE(ran, 3) << "world " << w;  // every world size runs several pairs
}

INSTANTIATE_TEST_SUITE_P(Formats, ReshardMpi,
                         ::testing::Values(Format::kNative, Format::kCkpt, Format::kSafetensors, Format::kHdf5),
                         [](const auto& info) { return std::string(format_name(info.param)); });

// Reading whole chunks to check their CRC32C is the opt-in: more bytes, same values.
TEST(ReshardChecks, PartialChunksAreCheckedWhenAskedTo) {
  const int w = world_size();
  if (w < 2) GTEST_SKIP() << "a partial chunk needs a split that differs: 2 ranks or more";
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  SharedTempDir dir;
  Model saved;
  saved.add("big", 0, DType::kFloat32, layout_for({16, 6144}, {1, w, 0}), true);
  SaveOptions so;
  so.name = "c";
  auto r = save(*comm, saved.state, dir.path(), so);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Model loaded;
  loaded.add("big", 0, DType::kFloat32, layout_for({16, 6144}, {1, w, 1}), false);
  LoadOptions checked;
  checked.check_partial_chunks = true;
  auto l = load(*comm, loaded.state, r->path, checked);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->bytes_needed, 16u * 6144 * 4);
  EXPECT_EQ(l->bytes_read, l->bytes_needed * static_cast<uint64_t>(w));  // every rank reads every chunk
  EXPECT_TRUE(all_ranks(loaded.mismatches() == 0));
}

// What users meet when the model changed since the save. Every rank gets the same error.
TEST(ReshardChecks, MissingTensorShapeAndDTypeMismatches) {
  const int w = world_size();
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  SharedTempDir dir;
  Model saved;
  saved.add("w", 1, DType::kFloat32, layout_for({12, 12}, {1, w, 0}), true);
  saved.add("ge4d", 5, DType::kFloat32, layout_for({6, 8, 1, 1}, {1, w % 2 == 0 ? 2 : 1, 0}), true);
  saved.add("flat", 6, DType::kFloat32, layout_for({6, 8}, {1, 1, 0}), true);
  SaveOptions so;
  so.name = "c";
  auto r = save(*comm, saved.state, dir.path(), so);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Parallel cols{1, w, 1};

  {  // a tensor the checkpoint does not have: refused by name when strict, else reported
    Model m;
    m.add("w", 1, DType::kFloat32, layout_for({12, 12}, cols), false);
    m.add("extra", 7, DType::kFloat32, layout_for({4}, {w, 1, 0}), false);
    LoadOptions strict;
    strict.only = {"w", "extra"};
    auto l = load(*comm, m.state, r->path, strict);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kMismatch);
    EXPECT_NE(l.status().message().find("'extra'"), std::string::npos) << l.status().to_string();
    LoadOptions lenient = strict;
    lenient.strict = false;
    auto ok = load(*comm, m.state, r->path, lenient);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(ok->missing_in_checkpoint, std::vector<std::string>{"extra"});
    Model only_w;  // "w" itself loaded right
    only_w.add("w", 1, DType::kFloat32, layout_for({12, 12}, cols), false);
    LoadOptions just_w;
    just_w.only = {"w"};
    ASSERT_TRUE(load(*comm, only_w.state, r->path, just_w).ok());
    EXPECT_TRUE(all_ranks(only_w.mismatches() == 0));
  }
  {  // another global shape: a clear error naming both shapes
    Model m;
    m.add("w", 1, DType::kFloat32, layout_for({12, 13}, {1, 1, 0}), false);
    LoadOptions o;
    o.only = {"w"};
    auto l = load(*comm, m.state, r->path, o);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kMismatch);
    EXPECT_NE(l.status().message().find("global shape"), std::string::npos) << l.status().to_string();
    Model lost_dim;  // dropping a dim that is not 1 is not the trailing-ones case
    lost_dim.add("flat", 6, DType::kFloat32, layout_for({6}, {1, 1, 0}), false);
    o.only = {"flat"};
    EXPECT_EQ(load(*comm, lost_dim.state, r->path, o).status().code(), StatusCode::kMismatch);
  }
  {  // trailing dims of size 1 differ only: accepted both ways (MindSpore: [12,2048,1,1] -> [12,2048])
    Model m;
    m.add("ge4d", 5, DType::kFloat32, layout_for({6, 8}, cols), false);
    m.add("flat", 6, DType::kFloat32, layout_for({6, 8, 1}, {1, w % 2 == 0 ? 2 : 1, 0}), false);
    LoadOptions o;
    o.only = {"ge4d", "flat"};
    auto l = load(*comm, m.state, r->path, o);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_TRUE(all_ranks(m.mismatches() == 0));
  }
  {  // another dtype: a clear error naming both
    Model m;
    m.add("w", 1, DType::kInt32, layout_for({12, 12}, cols), false);
    LoadOptions o;
    o.only = {"w"};
    auto l = load(*comm, m.state, r->path, o);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kMismatch);
    EXPECT_NE(l.status().message().find("dtype"), std::string::npos) << l.status().to_string();
  }
}

}  // namespace
}  // namespace distckpt
