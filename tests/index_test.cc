#include <gtest/gtest.h>

#include <cstring>

#include "base/text.h"
#include "catalog/names.h"
#include "format/describe.h"
#include "format/stored.h"
#include "format/native/index_codec.h"
#include "tools/inspect.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {
namespace {

proto::Index sample() {
  proto::Index index;
  index.set_name("step-1");
  index.set_world_size(2);
  index.set_step(1);
  auto* f = index.add_files();
  f->set_name("data-00000.bin");
  f->set_size(64);
  auto* t = index.add_tensors();
  t->set_name("w");
  t->set_dtype("float32");
  t->add_global_shape(4);
  t->add_global_shape(4);
  for (int i = 0; i < 2; ++i) {
    auto* c = t->add_chunks();
    c->add_offset(2 * i);
    c->add_offset(0);
    c->add_shape(2);
    c->add_shape(4);
    c->set_file_id(0);
    c->set_byte_offset(32 * i);
    c->set_length(32);
  }
  return index;
}

TEST(Crc32cTest, KnownVector) {
  EXPECT_EQ(internal_transform::crc32c("123456789", 9), 0xE3069283u);
  uint32_t s = internal_transform::crc32c_extend(internal_transform::kCrc32cInit, "1234", 4);
  s = internal_transform::crc32c_extend(s, "56789", 5);
  EXPECT_EQ(internal_transform::crc32c_finish(s), 0xE3069283u);
}

// Pieces checksummed apart give the whole's CRC, at every split of buffers from empty
// to longer than a few words (the combine works on the byte count's bits).
TEST(Crc32cTest, CombineEqualsTheWhole) {
  std::string bytes(5000, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 251);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{64}, std::size_t{5000}}) {
    const std::string whole = bytes.substr(0, n);
    for (std::size_t cut = 0; cut <= n; cut += (n < 64 ? 1 : 97)) {
      const uint32_t a = internal_transform::crc32c(whole.data(), cut);
      const uint32_t b = internal_transform::crc32c(whole.data() + cut, n - cut);
      EXPECT_EQ(internal_transform::crc32c_combine(a, b, n - cut), internal_transform::crc32c(whole.data(), n))
          << "length " << n << ", cut at " << cut;
    }
  }
  // A long run of zeros (a length with high bits): a shift by 2^33 + 5 bytes, checked
  // as two shifts of which it is the sum.
  const uint32_t c = internal_transform::crc32c("abc", 3);
  const uint64_t big = (uint64_t{1} << 33) + 5;
  EXPECT_EQ(internal_transform::crc32c_combine(c, 0, big),
            internal_transform::crc32c_combine(internal_transform::crc32c_combine(c, 0, uint64_t{1} << 33), 0, 5));
}

// Pieces placed apart: the XOR of their shifted contributions, whatever the order they
// are added in, is the whole's CRC (how ranks' runs of an HDF5 dataset combine).
TEST(Crc32cTest, PiecesPlacedApartAddUpToTheWhole) {
  for (uint64_t n : {0, 1, 7, 4096}) {
    const std::string zeros(n, '\0');
    EXPECT_EQ(internal_transform::crc32c_zeros(n), internal_transform::crc32c(zeros.data(), n)) << n;
  }
  std::string whole(3000, '\0');
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<char>((i * 7 + 3) % 253);
  const std::vector<std::pair<std::size_t, std::size_t>> pieces = {{2000, 1000}, {0, 10}, {10, 990}, {1000, 1000}};
  uint32_t sum = 0;
  for (const auto& [at, n] : pieces) {
    const uint32_t raw = internal_transform::crc32c(whole.data() + at, n) ^ internal_transform::crc32c_zeros(n);
    sum ^= internal_transform::crc32c_multiply(internal_transform::crc32c_shift_factor(whole.size() - at - n), raw);
  }
  EXPECT_EQ(sum ^ internal_transform::crc32c_zeros(whole.size()), internal_transform::crc32c(whole.data(), whole.size()));
}

TEST(IndexTest, RoundTrip) {
  auto parsed = parse_index(frame_index(sample()), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->tensors(0).chunks_size(), 2);
  CheckpointInfo info = internal_tools::to_checkpoint_info(*parsed, "/ck");
  EXPECT_EQ(info.tensors[0].chunks[1].file, "data-00000.bin");
  EXPECT_EQ(info.data_bytes(), 64u);
}

// Only a .ckpt's reader may say a file is encrypted whole and was opened with its key: an
// index.pb claiming it (to skip the sealed table's authentication) is refused.
TEST(IndexTest, AWholeFileEncryptionRecordInAnIndexIsRefused) {
  proto::Index forged = sample();
  forged.mutable_file_encryption()->set_mode("AES-GCM");
  forged.mutable_file_encryption()->set_algorithm("AES-256-GCM");
  forged.mutable_file_encryption()->set_opened(true);
  forged.mutable_transforms()->set_encryption("AES-256-GCM");
  const Status st = parse_index(frame_index(forged), "p").status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("whole-file encryption"), std::string::npos) << st.to_string();
}

TEST(IndexTest, FrameErrors) {
  std::string good = frame_index(sample());
  EXPECT_EQ(parse_index("short", "p").status().code(), StatusCode::kCorruption);
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_NE(parse_index(bad_magic, "p").status().message().find("bad magic"), std::string::npos);
  std::string newer = good;
  const uint32_t v = kIndexFormatVersion + 1;
  std::memcpy(newer.data() + 8, &v, 4);
  auto st = parse_index(newer, "p").status();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("newer"), std::string::npos);
  std::string truncated = good.substr(0, good.size() - 3);
  EXPECT_NE(parse_index(truncated, "p").status().message().find("truncated"), std::string::npos);
  std::string flipped = good;
  flipped.back() ^= 0x40;
  EXPECT_NE(parse_index(flipped, "p").status().message().find("crc32c"), std::string::npos);
}

// Re-frames a mutated index (valid checksum) so that only semantic checks can catch it.
Status validate_mutated(void (*mutate)(proto::Index&)) {
  proto::Index index = sample();
  mutate(index);
  return parse_index(frame_index(index), "p").status();
}

TEST(IndexTest, SemanticValidation) {
  struct Case {
    void (*mutate)(proto::Index&);
    const char* expect;
  };
  const Case cases[] = {
      {[](proto::Index& i) { i.mutable_tensors(0)->set_dtype("float128"); }, "unknown dtype"},
      {[](proto::Index& i) { i.mutable_tensors(0)->set_global_shape(0, -4); }, "negative or overflowing"},
      {[](proto::Index& i) { i.mutable_tensors(0)->set_global_shape(0, int64_t{1} << 40);
                             i.mutable_tensors(0)->set_global_shape(1, int64_t{1} << 40); }, "overflowing"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_byte_offset(40); }, "run past the end"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_byte_offset(~uint64_t{0} - 8); }, "run past"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_length(31); }, "length 31"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_file_id(7); }, "file id 7"},
      {[](proto::Index& i) { i.mutable_files(0)->set_name("../../etc/passwd"); }, "escapes"},
      {[](proto::Index& i) { i.mutable_files(0)->set_name("/abs"); }, "escapes"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_offset(0, 3); }, "outside the tensor"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks()->RemoveLast(); }, "cover 8 of the 16"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(0)->add_shape(1); }, "wrong number of dims"},
      {[](proto::Index& i) { *i.add_tensors() = i.tensors(0); }, "appears twice"},
      {[](proto::Index& i) { i.set_world_size(0); }, "world size"},
      {[](proto::Index& i) { i.set_world_size(int64_t{1} << 30); }, "world size"},
      // The next save takes the highest commit number + 1: none may be near 2^64.
      {[](proto::Index& i) { i.set_commit_seq(~uint64_t{0}); }, "commit number 18446744073709551615"},
      // Layouts: compact rank runs must lie in the world, lists must match dev_mat.
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_layout()->set_ranks_first(-1); }, "bad ranks_first"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_layout()->set_ranks_first(1); }, "bad ranks_first"},
      {[](proto::Index& i) { auto* l = i.mutable_tensors(0)->mutable_layout();
                             l->add_dev_mat(2); l->add_tensor_map(0); l->add_tensor_map(-1);
                             l->set_ranks_first(1); }, "lie outside the world of 2"},
      {[](proto::Index& i) { auto* l = i.mutable_tensors(0)->mutable_layout();
                             l->add_dev_mat(2); l->add_tensor_map(0); l->add_tensor_map(-1);
                             l->add_ranks(0); l->set_ranks_first(1); }, "bad ranks_first"},
      {[](proto::Index& i) { auto* l = i.mutable_tensors(0)->mutable_layout();
                             l->add_dev_mat(2); l->add_tensor_map(0); l->add_tensor_map(-1);
                             l->add_ranks(0); }, "lists 1 ranks for dev_mat of 2"},
      {[](proto::Index& i) { auto* l = i.mutable_tensors(0)->mutable_layout();
                             l->add_dev_mat(int64_t{1} << 40); l->add_tensor_map(0); l->add_tensor_map(-1); },
       "too large entry"},
      {[](proto::Index& i) { auto* l = i.mutable_tensors(0)->mutable_layout();
                             l->add_dev_mat(0); l->add_tensor_map(0); l->add_tensor_map(-1); }, "non-positive"},
      // References (incremental saves): one checkpoint name of the same root, never this one.
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint("../other"); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint(".."); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint("latest"); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint("x.tmp-0123"); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint(".distckpt"); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint(std::string("a\0b", 3)); }, "not a checkpoint name"},
      {[](proto::Index& i) { i.mutable_files(0)->set_checkpoint(i.name()); }, "its own checkpoint"},
      {[](proto::Index& i) { *i.add_files() = i.files(0); }, "listed twice"},
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(0)->set_content_hash("short"); }, "content hash has 5"},
      // Overlapping chunks whose volumes add up must not hide a gap.
      {[](proto::Index& i) { i.mutable_tensors(0)->mutable_chunks(1)->set_offset(0, 1); }, "overlap"},
  };
  for (const Case& c : cases) {
    Status st = validate_mutated(c.mutate);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << c.expect;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
  }
}

// A contiguous group is stored as its first rank; summaries list every rank as before.
TEST(IndexTest, CompactRankRunsAreListedInFull) {
  proto::Index index = sample();
  index.set_world_size(8);
  auto* l = index.mutable_tensors(0)->mutable_layout();
  l->add_dev_mat(2);
  l->add_dev_mat(2);
  l->add_tensor_map(1);
  l->add_tensor_map(-1);
  l->set_ranks_first(4);
  auto parsed = parse_index(frame_index(index), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(internal_tools::to_checkpoint_info(*parsed, "/ck").tensors[0].ranks, (std::vector<int>{4, 5, 6, 7}));
}

// A single file's own description (distckpt's metadata in a .ckpt, safetensors or HDF5
// file) is checked like a native index by the reader itself (attach_tensors), not only
// by its callers: a layout that disagrees with the stored dims is corruption.
TEST(IndexTest, SingleFileDescriptionsAreValidated) {
  proto::Index meta;
  meta.set_world_size(2);
  auto* t = meta.add_tensors();
  t->set_name("b");
  t->set_dtype("int64");
  t->add_global_shape(3);
  t->mutable_layout()->add_dev_mat(2);
  t->mutable_layout()->add_tensor_map(-1);
  auto attach = [&](const proto::Index& m) {
    proto::Index index = internal_format::describe_single_file(m, "ckpt", "none", "x.ckpt", 4096);
    std::map<std::string, proto::Tensor> found;
    found.emplace("b", internal_format::whole_tensor("b", DType::kInt64, {3}, 100, 24));
    return internal_format::attach_tensors(index, std::move(found), {"b"}, m, "x.ckpt");
  };
  EXPECT_TRUE(attach(meta).ok()) << attach(meta).to_string();
  meta.mutable_tensors(0)->mutable_layout()->add_tensor_map(-1);
  Status st = attach(meta);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("tensor_map has 2 entries for 1 dims"), std::string::npos) << st.message();
}

TEST(IndexTest, CheckpointNames) {
  EXPECT_TRUE(internal_catalog::validate_checkpoint_name("step-00000010").ok());
  for (const char* bad : {"", "a/b", "latest", "..", ".", "x.tmp-1"})
    EXPECT_EQ(internal_catalog::validate_checkpoint_name(bad).code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(data_file_name(3), "data-00003.bin");
}

// Names from files reach terminals: C0 and C1 controls (U+009B starts a control
// sequence on some terminals) are not printable and are escaped; other UTF-8 stays.
TEST(Text, ControlCharactersOfBothRangesAreEscaped) {
  using internal_base::is_printable_utf8;
  using internal_base::printable;
  EXPECT_TRUE(is_printable_utf8("caf\xc3\xa9 \xc2\xa0x"));  // é and a no-break space
  EXPECT_FALSE(is_printable_utf8("a\x1b[31m"));
  EXPECT_FALSE(is_printable_utf8("a\xc2\x9b" "31m"));
  EXPECT_FALSE(is_printable_utf8("\xc2\x80"));
  EXPECT_FALSE(is_printable_utf8("\xff"));
  EXPECT_EQ(printable("a\x1b]0;x\x07\xc2\x9b" "31m\xc3\xa9\xff"), "a\\x1b]0;x\\x07\\u009b31m\xc3\xa9\\xff");
}

}  // namespace
}  // namespace distckpt::internal_format
