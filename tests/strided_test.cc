// Strided buffers (StateDict's Strides) on in-process ranks: a strided save stores the
// same bytes as a packed one in every format and path (sync, async, encrypted,
// incremental), loads write in place through the strides and nowhere else, and loads
// refuse strides that cannot be written.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "comm/local_comm.h"
#include "distckpt/async.h"
#include "distckpt/checkpoint.h"
#include "distckpt/gather.h"
#include "distckpt/tier.h"
#include "layout/strided.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;
using testing::expect_all_ok;
using testing::run_ranks;

// How a tensor's box sits in the memory the test allocates for it.
enum class Form { kPacked, kHalo, kColumnMajor, kBroadcast, kReversed };

// A byte of element `global` (the element's row-major index in the global tensor).
unsigned char value_of(int64_t global, std::size_t k, int salt) {
  return static_cast<unsigned char>(global * 13 + static_cast<int64_t>(k) * 5 + salt);
}

struct Tensor {
  std::string name;
  DType dtype;
  Shape global;
  Shape map;
  Form form;
};

// Every form on a 2-D tensor split over the ranks, a 3-D float16 one with a halo, and a
// broadcast (saved only).
std::vector<Tensor> tensors(bool writable_only) {
  std::vector<Tensor> out = {
      {"halo", DType::kFloat32, {8, 12}, {-1, 0}, Form::kHalo},
      {"colmajor", DType::kFloat64, {12, 6}, {0, -1}, Form::kColumnMajor},
      {"halo3", DType::kFloat16, {3, 4, 8}, {-1, -1, 0}, Form::kHalo},
      {"packed", DType::kInt32, {4, 4}, {-1, -1}, Form::kPacked},
      // Replicated: loads read it once per replica group and send it to the others.
      {"halo_replicated", DType::kFloat32, {6, 5}, {-1, -1}, Form::kHalo},
  };
  if (!writable_only) {
    out.push_back({"bcast", DType::kFloat32, {5, 4}, {-1, -1}, Form::kBroadcast});
    out.push_back({"reversed", DType::kInt16, {6, 4}, {-1, 0}, Form::kReversed});
  }
  return out;
}

// One rank's tensors, held packed (the reference) or in their forms (`strided`).
struct Model {
  StateDict state;
  std::vector<std::vector<char>> memory;  // per tensor: what the test allocated
  std::vector<std::vector<char>> packed;  // per tensor: the box's expected packed bytes

  Model(int rank, int world, bool strided, const std::vector<Tensor>& list, int salt = 1) : state(rank) {
    for (const Tensor& t : list) {
      auto layout = TensorLayout::from_device_matrix(t.global, {world}, t.map);
      EXPECT_TRUE(layout.ok()) << layout.status().to_string();
      const Box box = layout->slice_box(rank);
      const std::size_t es = dtype_size(t.dtype);
      // The packed image: each element's bytes by its global index (a broadcast tensor's
      // rows are all its first row).
      std::vector<char> image(static_cast<std::size_t>(box.num_elements()) * es);
      for (int64_t i = 0; i < box.num_elements(); ++i) {
        int64_t global = 0, rem = i, step = 1;
        for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
          int64_t coord = box.offset[d] + rem % box.shape[d];
          rem /= box.shape[d];
          if (t.form == Form::kBroadcast && d == 0) coord = 0;
          global += coord * step;
          step *= t.global[d];
        }
        for (std::size_t k = 0; k < es; ++k) image[static_cast<std::size_t>(i) * es + k] = static_cast<char>(value_of(global, k, salt));
      }
      packed.push_back(image);
      add(t, *layout, box, strided ? t.form : Form::kPacked, image);
    }
  }

  void add(const Tensor& t, const TensorLayout& layout, const Box& box, Form form, const std::vector<char>& image) {
    const std::size_t es = dtype_size(t.dtype);
    const std::size_t dims = box.shape.size();
    Shape alloc = box.shape;
    Strides strides(dims);
    int64_t first = 0;  // element offset of the box's first element in the allocation
    switch (form) {
      case Form::kPacked:
      case Form::kReversed: {
        int64_t s = 1;
        for (std::size_t d = dims; d-- > 0;) strides[d] = s, s *= alloc[d];
        if (form == Form::kReversed) {
          first = (alloc[0] - 1) * strides[0];
          strides[0] = -strides[0];
        }
        break;
      }
      case Form::kHalo: {
        for (auto& a : alloc) a += 4;  // two cells each side
        int64_t s = 1;
        for (std::size_t d = dims; d-- > 0;) strides[d] = s, first += 2 * s, s *= alloc[d];
        break;
      }
      case Form::kColumnMajor: {
        int64_t s = 1;
        for (std::size_t d = 0; d < dims; ++d) strides[d] = s, s *= alloc[d];
        break;
      }
      case Form::kBroadcast: {
        alloc[0] = 1;
        int64_t s = 1;
        for (std::size_t d = dims; d-- > 0;) strides[d] = s, s *= alloc[d];
        strides[0] = 0;
        break;
      }
    }
    int64_t total = 1;
    for (int64_t a : alloc) total *= a;
    memory.emplace_back(static_cast<std::size_t>(total) * es, static_cast<char>(0x5a));  // halo: 0x5a
    char* data = memory.back().data() + first * static_cast<int64_t>(es);
    // Place the image through the strides (the broadcast: only its first row exists).
    for (int64_t i = 0; i < box.num_elements(); ++i) {
      int64_t at = 0, rem = i;
      for (std::size_t d = dims; d-- > 0;) {
        at += (rem % box.shape[d]) * strides[d];
        rem /= box.shape[d];
      }
      std::memcpy(data + at * static_cast<int64_t>(es), image.data() + i * static_cast<int64_t>(es), es);
    }
    const Status added = form == Form::kPacked ? state.add_tensor(t.name, t.dtype, data, layout)
                                               : state.add_tensor(t.name, t.dtype, data, strides, layout);
    EXPECT_TRUE(added.ok()) << added.to_string();
  }

  // Every tensor's box, read back through its strides.
  std::vector<std::vector<char>> read_back() const {
    std::vector<std::vector<char>> out;
    for (const TensorEntry& e : state.tensors()) {
      const std::size_t bytes = e.boxes.empty() ? 0 : static_cast<std::size_t>(e.boxes[0].num_elements()) * dtype_size(e.dtype);
      out.emplace_back(bytes);
      if (bytes) internal_layout::copy_packed_out(e, 0, 0, bytes, out.back().data());
    }
    return out;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The data files of two checkpoints of one name (directories, or single files) are
// equal byte for byte. An index records its save's time: a directory's data files are
// compared; a .ckpt (whose header holds the time, and whose CRC-32 footer covers it)
// must differ nowhere else than in its first 64 and last 32 bytes; a safetensors file's
// data (after its JSON header) must be equal.
void expect_same_file(const fs::path& a, const fs::path& b) {
  const std::string x = slurp(a), y = slurp(b);
  ASSERT_EQ(x.size(), y.size()) << a << " vs " << b;
  if (a.extension() == ".safetensors") {  // 8 bytes of header length, the JSON header, the data
    uint64_t header = 0;
    ASSERT_GE(x.size(), 8u);
    std::memcpy(&header, x.data(), 8);
    ASSERT_LE(header, x.size() - 8);
    EXPECT_TRUE(x.substr(8 + header) == y.substr(8 + header)) << a << " vs " << b;
    return;
  }
  if (a.extension() != ".ckpt") {
    EXPECT_TRUE(x == y) << a << " vs " << b;
    return;
  }
  // (The last 32 bytes: the footer and the structure CRC32C before it, which cover the time.)
  ASSERT_GT(x.size(), 96u);
  EXPECT_TRUE(x.substr(64, x.size() - 96) == y.substr(64, y.size() - 96)) << a << " vs " << b;
}

void expect_same_data(const fs::path& a, const fs::path& b) {
  if (fs::is_regular_file(a)) return expect_same_file(a, b);
  int compared = 0;
  for (const auto& entry : fs::recursive_directory_iterator(a)) {
    if (!entry.is_regular_file()) continue;
    const fs::path rel = fs::relative(entry.path(), a);
    const std::string file = rel.filename().string();
    if (file.rfind("data", 0) != 0 && rel.extension() != ".ckpt") continue;
    ASSERT_TRUE(fs::exists(b / rel)) << rel;
    expect_same_file(entry.path(), b / rel);
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no data files under " << a;
}

class StridedTest : public ::testing::TestWithParam<int> {
 protected:
  testing::TempDir tmp_;
  std::string root() const { return tmp_.path() + "/ckpts"; }
};

TEST_P(StridedTest, SavesTheSameBytesAsPackedBuffersInEveryFormat) {
  const int world = GetParam();
  struct Case {
    const char* name;
    Format format;
    std::optional<bool> integrated;
    const char* extension;
  };
  const Case cases[] = {{"native", Format::kNative, std::nullopt, ""},
                        {"native_integrated", Format::kNative, true, ""},
                        {"ckpt", Format::kCkpt, std::nullopt, ".ckpt"},
                        {"ckpt_set", Format::kCkpt, false, ""},
                        {"safetensors", Format::kSafetensors, std::nullopt, ".safetensors"}};
  for (const Case& c : cases) {
    expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
      for (bool strided : {false, true}) {
        Model m(comm.rank(), world, strided, tensors(false));
        SaveOptions o;
        o.name = c.name;
        o.format = c.format;
        o.integrated = c.integrated;
        DISTCKPT_RETURN_IF_ERROR(save(comm, m.state, root() + (strided ? "/strided" : "/packed"), o).status());
      }
      return Status();
    }));
    expect_same_data(root() + "/packed/" + c.name + c.extension, root() + "/strided/" + c.name + c.extension);
  }
}

TEST_P(StridedTest, HDF5SavesAndGathersReadThroughTheStrides) {
  const int world = GetParam();
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    Model strided(comm.rank(), world, true, tensors(false), 5);
    SaveOptions o;
    o.name = "h";
    o.format = Format::kHdf5;
    DISTCKPT_RETURN_IF_ERROR(save(comm, strided.state, root(), o).status());
    Model packed(comm.rank(), world, false, tensors(false), 60);
    DISTCKPT_RETURN_IF_ERROR(load(comm, packed.state, root() + "/h.h5", {}).status());
    EXPECT_EQ(packed.read_back(), strided.packed);
    // Whole tensors gathered from strided and from packed buffers are the same.
    Model reference(comm.rank(), world, false, tensors(false), 5);
    for (const TensorEntry& e : strided.state.tensors()) {
      std::size_t bytes = dtype_size(e.dtype);
      for (int64_t extent : e.layout.global_shape()) bytes *= static_cast<std::size_t>(extent);
      std::vector<char> a(bytes), b(bytes);
      DISTCKPT_RETURN_IF_ERROR(gather_full(comm, strided.state, e.name, a.data()));
      DISTCKPT_RETURN_IF_ERROR(gather_full(comm, reference.state, e.name, b.data()));
      EXPECT_TRUE(a == b) << e.name;
    }
    return Status();
  }));
}

TEST_P(StridedTest, AsyncSavesStageThePackedBytes) {
  const int world = GetParam();
  auto fg = internal_comm::make_local_comms(world);
  auto bg = internal_comm::make_local_comms(world);
  auto other = internal_comm::make_local_comms(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      AsyncOptions small;
      small.staging_bytes = 8192;  // smaller than a rank's share: staging pipelines
      small.slab_bytes = 4096;
      auto ckpt = AsyncCheckpointer::create(std::move(fg[r]), std::move(bg[r]), small);
      ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
      Model strided(r, world, true, tensors(false));
      SaveOptions o;
      o.name = "async";
      ASSERT_TRUE((*ckpt)->save_async(strided.state, root(), o).ok());
      for (auto& m : strided.memory) std::fill(m.begin(), m.end(), 0);  // the loop goes on
      auto done = (*ckpt)->wait();
      ASSERT_TRUE(done.ok()) << done.status().to_string();
      // A single file: the state copied (packed) before the gather to the writer.
      Model strided_file(r, world, true, tensors(false));
      SaveOptions file = o;
      file.format = Format::kSafetensors;
      ASSERT_TRUE((*ckpt)->save_async(strided_file.state, root() + "/async_file", file).ok());
      for (auto& m : strided_file.memory) std::fill(m.begin(), m.end(), 0);
      done = (*ckpt)->wait();
      ASSERT_TRUE(done.ok()) << done.status().to_string();
      Model packed(r, world, false, tensors(false));
      o.name = "sync";
      auto saved = save(*other[r], packed.state, root(), o);
      ASSERT_TRUE(saved.ok()) << saved.status().to_string();
      saved = save(*other[r], packed.state, root() + "/sync_file", file);
      ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    });
  for (auto& t : threads) t.join();
  expect_same_data(root() + "/sync", root() + "/async");
  expect_same_data(root() + "/sync_file/async.safetensors", root() + "/async_file/async.safetensors");
}

TEST_P(StridedTest, LoadsWriteInPlaceThroughTheStridesOnly) {
  const int world = GetParam();
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    Model source(comm.rank(), world, false, tensors(true), 7);
    SaveOptions o;
    o.name = "a";
    DISTCKPT_RETURN_IF_ERROR(save(comm, source.state, root(), o).status());
    // Each rank reading for itself (strided boxes through one reused buffer), and replicas
    // sharing reads (a box read once, sent whole, then scattered).
    for (auto reads : {LoadOptions::ReplicaReads::kEach, LoadOptions::ReplicaReads::kShared}) {
      Model target(comm.rank(), world, true, tensors(true), 99);
      LoadOptions lo;
      lo.replica_reads = reads;
      DISTCKPT_RETURN_IF_ERROR(load(comm, target.state, root() + "/a", lo).status());
      EXPECT_EQ(target.read_back(), source.packed);
      // The whole memory, halo cells included, is what the saved values placed through
      // the strides give: nothing outside the boxes was written.
      const Model expected(comm.rank(), world, true, tensors(true), 7);
      EXPECT_TRUE(target.memory == expected.memory) << "rank " << comm.rank();
    }
    return Status();
  }));
}

TEST_P(StridedTest, CastsIntoStridedBuffers) {
  const int world = GetParam();
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    auto layout = *TensorLayout::from_device_matrix({4, 8}, {world}, {-1, 0});
    const Box box = layout.slice_box(comm.rank());
    std::vector<float> narrow(static_cast<std::size_t>(box.num_elements()));
    for (std::size_t i = 0; i < narrow.size(); ++i) narrow[i] = 0.5f * static_cast<float>(i + 1);
    StateDict in(comm.rank());
    DISTCKPT_RETURN_IF_ERROR(in.add_tensor("w", DType::kFloat32, narrow.data(), layout));
    SaveOptions o;
    o.name = "f32";
    DISTCKPT_RETURN_IF_ERROR(save(comm, in, root(), o).status());
    // float64, column-major.
    std::vector<double> wide(narrow.size(), -1.0);
    StateDict out(comm.rank());
    DISTCKPT_RETURN_IF_ERROR(out.add_tensor("w", DType::kFloat64, wide.data(), Strides{1, box.shape[0]}, layout));
    LoadOptions lo;
    lo.cast_floats = true;
    DISTCKPT_RETURN_IF_ERROR(load(comm, out, root() + "/f32", lo).status());
    for (int64_t r = 0; r < box.shape[0]; ++r)
      for (int64_t c = 0; c < box.shape[1]; ++c)
        EXPECT_EQ(wide[static_cast<std::size_t>(c * box.shape[0] + r)], narrow[static_cast<std::size_t>(r * box.shape[1] + c)]);
    return Status();
  }));
}

TEST_P(StridedTest, IncrementalSavesHashThePackedBytes) {
  const int world = GetParam();
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    Model packed(comm.rank(), world, false, tensors(false));
    SaveOptions o;
    o.name = "base";
    o.incremental = true;  // (the first has no base: written whole, with its hashes)
    DISTCKPT_RETURN_IF_ERROR(save(comm, packed.state, root(), o).status());
    Model strided(comm.rank(), world, true, tensors(false));
    o.name = "next";
    DISTCKPT_ASSIGN_OR_RETURN(SaveResult r, save(comm, strided.state, root(), o));
    EXPECT_EQ(r.bytes_written, 0u) << "the same content, strided, was written again";
    EXPECT_EQ(r.incremental_base, "base");
    return Status();
  }));
}

TEST_P(StridedTest, EncryptedSavesRoundTrip) {
  const int world = GetParam();
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(16, '\x07')));
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    Model strided(comm.rank(), world, true, tensors(false));
    SaveOptions o;
    o.name = "enc";
    o.encryption.key = key;
    DISTCKPT_RETURN_IF_ERROR(save(comm, strided.state, root(), o).status());
    Model packed(comm.rank(), world, false, tensors(false), 50);
    LoadOptions lo;
    lo.key = key;
    DISTCKPT_RETURN_IF_ERROR(load(comm, packed.state, root() + "/enc", lo).status());
    EXPECT_EQ(packed.read_back(), strided.packed);
    return Status();
  }));
}

TEST_P(StridedTest, LoadsRefuseStridesThatCannotBeWritten) {
  const int world = GetParam();
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    Model source(comm.rank(), world, false, tensors(false));
    SaveOptions o;
    o.name = "a";
    DISTCKPT_RETURN_IF_ERROR(save(comm, source.state, root(), o).status());
    for (const char* bad : {"bcast", "reversed"}) {
      Model target(comm.rank(), world, true, tensors(false));
      LoadOptions lo;
      lo.only = {bad};
      auto r = load(comm, target.state, root() + "/a", lo);
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(r.status().message().find(std::string("tensor '") + bad + "'"), std::string::npos)
          << r.status().to_string();
      EXPECT_NE(r.status().message().find("stride"), std::string::npos) << r.status().to_string();
    }
    // Overlapping: rows 1 element apart over 4 columns.
    auto layout = *TensorLayout::from_device_matrix({4, 4}, {world}, {-1, -1});
    std::vector<int32_t> mem(16, 0);
    StateDict overlapping(comm.rank());
    DISTCKPT_RETURN_IF_ERROR(overlapping.add_tensor("packed", DType::kInt32, mem.data(), Strides{1, 1}, layout));
    LoadOptions lo;
    lo.only = {"packed"};
    auto r = load(comm, overlapping, root() + "/a", lo);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("overlap"), std::string::npos) << r.status().to_string();
    EXPECT_EQ(mem, std::vector<int32_t>(16, 0)) << "a refused load wrote";
    return Status();
  }));
}

TEST_P(StridedTest, TheLocalTierSavesAndRestoresStridedBuffers) {
  const int world = GetParam();
  const std::string local = tmp_.path() + "/local/{host}";
  internal_comm::run_local_ranks(
      world,
      [&](Comm& comm) {
        Model strided(comm.rank(), world, true, tensors(true), 3);
        SaveOptions o;
        o.name = "s1";
        o.step = 1;
        auto saved = save_local(comm, strided.state, root(), o, {local, "auto"});
        ASSERT_TRUE(saved.ok()) << saved.status().to_string();
        Model target(comm.rank(), world, true, tensors(true), 40);
        auto restored = restore(comm, target.state, root(), {local, "auto"}, {});
        ASSERT_TRUE(restored.ok()) << restored.status().to_string();
        EXPECT_EQ(target.read_back(), strided.packed);
      },
      /*ranks_per_node=*/world > 1 ? world / 2 : 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, StridedTest, ::testing::Values(1, 2, 4));

// Byte ranges that start and end inside elements, against a reference packing.
TEST(StridedPieces, AnyByteRangeOfThePackedImage) {
  const int64_t rows = 5, cols = 7, pitch = 11;
  // Room for the row-major (rows x pitch) and the column-major (cols x pitch) placements.
  std::vector<uint32_t> mem(static_cast<std::size_t>(std::max(rows, cols) * pitch + 3), 0xeeeeeeee);
  std::vector<uint32_t> image(static_cast<std::size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      mem[static_cast<std::size_t>(r * pitch + c)] = image[static_cast<std::size_t>(r * cols + c)] =
          static_cast<uint32_t>(0x01020304u * static_cast<uint32_t>(r * cols + c + 1));
  auto layout = *TensorLayout::from_device_matrix({rows, cols}, {1}, {-1, -1});
  for (const Strides& strides : {Strides{pitch, 1}, Strides{1, pitch}}) {
    std::vector<uint32_t> target = mem;
    if (strides[0] == 1) {  // the same values column-major
      std::fill(target.begin(), target.end(), 0xeeeeeeee);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          target[static_cast<std::size_t>(c * pitch + r)] = image[static_cast<std::size_t>(r * cols + c)];
    }
    StateDict state(0);
    ASSERT_TRUE(state.add_tensor("t", DType::kUInt32, target.data(), strides, layout).ok());
    const TensorEntry& e = state.tensors()[0];
    ASSERT_FALSE(e.packed(0));
    const auto* want = reinterpret_cast<const char*>(image.data());
    const std::size_t total = image.size() * 4;
    for (std::size_t from : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{27}, std::size_t{29}})
      for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{28}, std::size_t{31}, total - from}) {
        if (from + n > total) continue;
        std::string got(n, '\0');
        internal_layout::copy_packed_out(e, 0, from, n, got.data());
        EXPECT_EQ(got, std::string(want + from, n)) << "from " << from << " n " << n;
      }
    // Written back a few bytes at a time, the memory ends as it was.
    const std::vector<uint32_t> before = target;
    std::fill(target.begin(), target.end(), 0xeeeeeeee);
    for (std::size_t at = 0; at < total; at += 3)
      internal_layout::copy_packed_in(e, 0, at, std::min<std::size_t>(3, total - at), want + at);
    EXPECT_EQ(target, before);
  }
}

// A 3-D box with a negative, a padded and a non-unit inner stride: every byte range of
// its packed image, against the element-by-element definition.
TEST(StridedPieces, ThreeDimensionsWithANegativeStride) {
  const Shape shape{3, 4, 5};
  const Strides strides{-60, 12, 2};  // dim 0 reversed, dim 1 padded, every other element
  std::vector<uint16_t> mem(3 * 60, 0);
  for (std::size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint16_t>(i * 31 + 7);
  uint16_t* first = mem.data() + 2 * 60;  // element (0, 0, 0): the last plane
  std::vector<uint16_t> image;
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t c = 0; c < 5; ++c) image.push_back(first[a * strides[0] + b * strides[1] + c * strides[2]]);
  auto layout = *TensorLayout::from_device_matrix(shape, {1}, {-1, -1, -1});
  StateDict state(0);
  ASSERT_TRUE(state.add_tensor("t", DType::kUInt16, first, strides, layout).ok());
  const TensorEntry& e = state.tensors()[0];
  const auto* want = reinterpret_cast<const char*>(image.data());
  const std::size_t total = image.size() * 2;
  for (std::size_t from = 0; from < total; from += 7)
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{10}, std::size_t{41}, total}) {
      const std::size_t len = std::min(n, total - from);
      std::string got(len, '\0');
      internal_layout::copy_packed_out(e, 0, from, len, got.data());
      ASSERT_EQ(got, std::string(want + from, len)) << "from " << from << " n " << len;
    }
  EXPECT_EQ(internal_layout::check_writable(e).code(), StatusCode::kInvalidArgument);  // negative
}

TEST(StridedPieces, PackedStridesAreTheFastPath) {
  auto layout = *TensorLayout::from_device_matrix({1, 6, 1}, {1}, {-1, -1, -1});
  StateDict state(0);
  std::vector<float> mem(6);
  // Row-major, whatever the strides of extent-1 dimensions say.
  ASSERT_TRUE(state.add_tensor("t", DType::kFloat32, mem.data(), Strides{1000, 1, 77}, layout).ok());
  EXPECT_TRUE(state.tensors()[0].packed(0));
  EXPECT_FALSE(state.tensors()[0].strided());
  // A wrong count of strides names the tensor.
  Status bad = state.add_tensor("u", DType::kFloat32, mem.data(), Strides{1, 1}, layout);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'u'"), std::string::npos) << bad.to_string();
}

}  // namespace
}  // namespace distckpt
