// distckpt::Reader: one checkpoint in one process, any format, whole tensors or a box,
// and the errors its contract names.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/reader.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

// A [6, 4] float32 tensor split by rows over 2 ranks, and an int64 scalar-like [3].
Status save_model(const std::string& root, Format format) {
  for (const auto& r : testing::run_ranks(2, [&](Comm& comm) -> Status {
         std::vector<float> rows(12);
         for (int i = 0; i < 12; ++i) rows[static_cast<std::size_t>(i)] = static_cast<float>(comm.rank() * 12 + i);
         std::vector<int64_t> counts{7, 8, 9};
         StateDict state(comm.rank());
         DISTCKPT_ASSIGN_OR_RETURN(TensorLayout split, TensorLayout::from_device_matrix({6, 4}, {2}, {0, -1}));
         DISTCKPT_ASSIGN_OR_RETURN(TensorLayout whole, TensorLayout::from_device_matrix({3}, {2}, {-1}));
         DISTCKPT_RETURN_IF_ERROR(state.add_tensor("w", DType::kFloat32, rows.data(), split));
         DISTCKPT_RETURN_IF_ERROR(state.add_tensor("counts", DType::kInt64, counts.data(), whole));
         SaveOptions options;
         options.name = "m";
         options.format = format;
         return save(comm, state, root, options).status();
       }))
    if (r != "ok") return internal_error(r);
  return Status();
}

TEST(Reader, ReadsWholeTensorsAndBoxesOfEveryFormat) {
  for (Format format : {Format::kNative, Format::kCkpt, Format::kSafetensors, Format::kHdf5}) {
    SCOPED_TRACE(std::string(format_name(format)));
    testing::TempDir dir;
    ASSERT_TRUE(save_model(dir.path(), format).ok());
    auto reader = Reader::open(dir.path());  // the root: its newest checkpoint
    ASSERT_TRUE(reader.ok()) << reader.status().to_string();
    ASSERT_NE(reader->tensor("w"), nullptr);
    EXPECT_EQ(reader->tensor("w")->global_shape, (Shape{6, 4}));
    EXPECT_EQ(reader->tensor("nothing"), nullptr);
    EXPECT_EQ(reader->info().tensors.size(), 2u);
    std::vector<float> w(24);
    ASSERT_TRUE(reader->read("w", w.data(), w.size() * sizeof(float)).ok());
    for (int i = 0; i < 24; ++i) EXPECT_EQ(w[static_cast<std::size_t>(i)], static_cast<float>(i));
    // Rows 2..4, columns 1..2: a box across both ranks' slices.
    std::vector<float> box(3 * 2);
    ASSERT_TRUE(reader->read("w", Box{{2, 1}, {3, 2}}, box.data(), box.size() * sizeof(float)).ok());
    EXPECT_EQ(box, (std::vector<float>{9, 10, 13, 14, 17, 18}));
    std::vector<int64_t> counts(3);
    ASSERT_TRUE(reader->read("counts", counts.data(), 3 * sizeof(int64_t)).ok());
    EXPECT_EQ(counts, (std::vector<int64_t>{7, 8, 9}));
    EXPECT_EQ(reader->read("nothing", w.data(), 4).code(), StatusCode::kNotFound);
    EXPECT_EQ(reader->read("w", w.data(), 4).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(reader->read("w", Box{{5, 0}, {2, 4}}, w.data(), 8 * sizeof(float)).code(),
              StatusCode::kInvalidArgument);  // past the last row
  }
}

TEST(Reader, SaysWhatIsMissingAndRefusesDamage) {
  testing::TempDir dir;
  EXPECT_EQ(Reader::open(dir.path() + "/none").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(save_model(dir.path(), Format::kNative).ok());
  // A flipped byte of a data file: the read that covers it fails, naming the file.
  const std::string data = dir.path() + "/m/data-00000.bin";
  std::FILE* f = std::fopen(data.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 5, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, 5, SEEK_SET);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
  auto reader = Reader::open(dir.path() + "/m");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  std::vector<float> w(24);
  Status st = reader->read("w", w.data(), w.size() * sizeof(float));
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("data-00000.bin"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace distckpt
