#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <tuple>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "storage/fault_fs.h"
#include "storage/stream_writer.h"
#include "test_util.h"
#include "transform/crc32c.h"

namespace distckpt::internal_storage {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Chunks of awkward sizes through a tiny pool (2 slabs of 8 KiB): chunks straddle
// slabs, some slabs hold many chunks, the tail is not aligned. Parameters: direct I/O,
// and which thread takes the CRCs.
class StreamWriterTest : public ::testing::TestWithParam<std::tuple<bool, StreamWriter::ChecksumOn>> {
 protected:
  bool direct() const { return std::get<0>(GetParam()); }
  StreamWriter::ChecksumOn checksum_on() const { return std::get<1>(GetParam()); }
};

// Chunks at 64-byte starts (as data files lay them out), the gaps between them zeros
// outside every CRC, empty chunks among them and at the end.
// Slabs of 8 KiB, and of 1 MiB, where a chunk over 256 KiB is checksummed in pieces
// (ChecksumOn::kAppend).
TEST_P(StreamWriterTest, ChunkChecksumsAndBytesSurviveSlabBoundaries) {
  for (const std::size_t slab : {std::size_t{8192}, std::size_t{1} << 20}) {
    SCOPED_TRACE("slab " + std::to_string(slab));
    testing::TempDir tmp;
    const std::string path = tmp.path() + "/data.bin";
    const std::vector<std::size_t> sizes{1, 5000, 8192, 3, 0, 20000, 700001, 100, 16384, 7777, 0};
    std::vector<std::string> chunks;
    std::vector<ByteRange> ranges;
    std::string expected;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::string c(sizes[i], '\0');
      for (std::size_t k = 0; k < c.size(); ++k) c[k] = static_cast<char>(k * 7 + i * 13 + 1);
      const uint64_t begin = sizes[i] == 0 ? expected.size() : (expected.size() + 63) / 64 * 64;
      chunks.push_back(std::string(begin - expected.size(), '\0') + c);  // appended: the gap, then the chunk
      ranges.push_back({begin, begin + c.size()});
      expected += chunks.back();
    }
    const uint64_t total = expected.size();
    WriteOpenOptions open_options;
    open_options.direct_io = direct();
    auto file = posix_filesystem()->open_writable(path, open_options);
    ASSERT_TRUE(file.ok());
    StagingPool pool(2 * slab, slab, /*grow=*/true, StagingPool::FirstTouch::kOnUse);
    StreamWriter writer(std::move(*file), pool, ranges, path, /*checksum=*/true, /*hold=*/false, checksum_on());
    for (const auto& c : chunks) ASSERT_TRUE(writer.append(c.data(), c.size()).ok());
    auto crcs = writer.finish(/*fsync=*/true);
    ASSERT_TRUE(crcs.ok()) << crcs.status().to_string();
    ASSERT_EQ(crcs->size(), chunks.size());
    for (std::size_t i = 0; i < chunks.size(); ++i)
      EXPECT_EQ((*crcs)[i], internal_transform::crc32c(expected.data() + ranges[i].begin, ranges[i].end - ranges[i].begin))
          << i;
    const std::string on_disk = read_file(path);
    EXPECT_EQ(on_disk.size(), total) << "the padding of the last direct write must be trimmed";
    EXPECT_EQ(on_disk, expected);
  }
}

// Without checksums (SaveOptions::checksum false) every chunk still gets its (zero) entry
// and the bytes are the same.
TEST_P(StreamWriterTest, NoChecksumsStillAccountsForEveryChunk) {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/data.bin";
  const std::string data(300000, 'z');
  const std::vector<ByteRange> ranges{{0, 1000}, {1024, 1024}, {1024, 299000}, {299008, 300000}};
  WriteOpenOptions open_options;
  open_options.direct_io = direct();
  auto file = posix_filesystem()->open_writable(path, open_options);
  ASSERT_TRUE(file.ok());
  StagingPool pool(2 << 20, 1 << 20);
  StreamWriter writer(std::move(*file), pool, ranges, path, /*checksum=*/false, /*hold=*/false, checksum_on());
  ASSERT_TRUE(writer.append(data.data(), data.size()).ok());
  auto crcs = writer.finish(/*fsync=*/false);
  ASSERT_TRUE(crcs.ok()) << crcs.status().to_string();
  EXPECT_EQ(crcs->size(), ranges.size());
  EXPECT_EQ(read_file(path), data);
}

TEST_P(StreamWriterTest, WriteErrorReachesTheCallerWithoutHanging) {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/data.bin";
  FaultSpec spec;
  spec.write_budget = 10000;
  FaultFileSystem fs(posix_filesystem(), spec);
  WriteOpenOptions open_options;
  open_options.direct_io = direct();
  auto file = fs.open_writable(path, open_options);
  ASSERT_TRUE(file.ok());
  StagingPool pool(16384, 8192);
  const std::string data(100000, 'x');
  StreamWriter writer(std::move(*file), pool, std::vector<ByteRange>{{0, data.size()}}, path, true, false,
                      checksum_on());
  Status appended;
  for (std::size_t off = 0; off < data.size() && appended.ok(); off += 1000)
    appended = writer.append(data.data() + off, 1000);
  auto done = writer.finish(true);
  ASSERT_FALSE(done.ok());
  EXPECT_NE(done.status().message().find("No space left"), std::string::npos) << done.status().to_string();
}

TEST_P(StreamWriterTest, AbandonedStreamReleasesItsSlabs) {
  testing::TempDir tmp;
  StagingPool pool(16384, 8192);
  for (int round = 0; round < 3; ++round) {
    const std::string path = tmp.path() + "/data" + std::to_string(round) + ".bin";
    WriteOpenOptions open_options;
    open_options.direct_io = direct();
    auto file = posix_filesystem()->open_writable(path, open_options);
    ASSERT_TRUE(file.ok());
    StreamWriter writer(std::move(*file), pool, std::vector<ByteRange>{{0, 50000}}, path, true, false, checksum_on());
    const std::string data(20000, 'y');
    ASSERT_TRUE(writer.append(data.data(), data.size()).ok());
    // Destroyed without finish(): every slab must come back to the pool, or the next
    // round would wait forever in acquire().
  }
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, StreamWriterTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(StreamWriter::ChecksumOn::kWriterThread,
                                                              StreamWriter::ChecksumOn::kAppend)));

// A file in memory that counts its writes.
class CountingFile final : public WritableFile {
 public:
  explicit CountingFile(std::string* bytes, std::atomic<int>* writes) : bytes_(bytes), writes_(writes) {}
  Status write_at(const void* data, std::size_t n, uint64_t offset) override {
    if (bytes_->size() < offset + n) bytes_->resize(offset + n);
    std::memcpy(bytes_->data() + offset, data, n);
    ++*writes_;
    return Status();
  }
  Status truncate(uint64_t size) override {
    bytes_->resize(size);
    return Status();
  }
  Status sync() override { return Status(); }
  Status close() override { return Status(); }

 private:
  std::string* bytes_;
  std::atomic<int>* writes_;
};

// With hold (an asynchronous save through the page cache), full slabs wait until the
// caller is done staging, or until the pool is full and only writing frees a slab.
TEST(StreamWriterHold, SlabsWaitUntilReleasedOrThePoolIsFull) {
  constexpr std::size_t kSlab = 8192;
  std::string expected(6 * kSlab, '\0');
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<char>(i * 31 + 7);
  auto wait_for = [](const std::atomic<int>& writes, int n) {
    for (int i = 0; i < 500 && writes.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return writes.load();
  };
  {  // released by the caller
    std::string bytes;
    std::atomic<int> writes{0};
    StagingPool pool(8 * kSlab, kSlab);
    StreamWriter writer(std::make_unique<CountingFile>(&bytes, &writes), pool, std::vector<ByteRange>{{0, 3 * kSlab}}, "mem", true, /*hold=*/true);
    ASSERT_TRUE(writer.append(expected.data(), 3 * kSlab).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(writes.load(), 0) << "nothing is written while the caller stages";
    writer.release_hold();
    EXPECT_EQ(wait_for(writes, 3), 3);
    auto crcs = writer.finish(false);
    ASSERT_TRUE(crcs.ok());
    EXPECT_EQ(bytes, expected.substr(0, 3 * kSlab));
    EXPECT_EQ((*crcs)[0], internal_transform::crc32c(expected.data(), 3 * kSlab));
  }
  {  // a pool of 4 slabs for 6 slabs of bytes: writing starts when it is full
    std::string bytes;
    std::atomic<int> writes{0};
    StagingPool pool(4 * kSlab, kSlab);
    StreamWriter writer(std::make_unique<CountingFile>(&bytes, &writes), pool, std::vector<ByteRange>{{0, 6 * kSlab}}, "mem", true, /*hold=*/true);
    ASSERT_TRUE(writer.append(expected.data(), 6 * kSlab).ok());
    EXPECT_GE(writes.load(), 1) << "the fifth slab could only come from a written one";
    auto crcs = writer.finish(false);
    ASSERT_TRUE(crcs.ok());
    EXPECT_EQ(writes.load(), 6);
    EXPECT_EQ(bytes, expected);
  }
}

// A growing pool (the async checkpointer's, and the sync save's) holds 2 slabs until more
// are in use at once, then keeps what it made, never more than its budget.
TEST(StagingPool, GrowsOnlyAsFarAsUseDemands) {
  StagingPool pool(8 * 8192, 8192, /*grow=*/true);
  EXPECT_EQ(pool.slab_count(), 2u);
  EXPECT_EQ(pool.max_slab_count(), 8u);
  std::vector<char*> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool.acquire());
  EXPECT_EQ(pool.slab_count(), 3u);
  for (char* s : held) pool.release(s);
  held.clear();
  for (int i = 0; i < 3; ++i) held.push_back(pool.acquire());
  EXPECT_EQ(pool.slab_count(), 3u);  // reused
  for (int i = 0; i < 5; ++i) held.push_back(pool.acquire());
  EXPECT_EQ(pool.slab_count(), 8u);
  std::thread waiter([&] { char* s = pool.acquire(); pool.release(s); });  // waits: the pool is at its budget
  pool.release(held.back());
  waiter.join();
  EXPECT_EQ(pool.slab_count(), 8u);
  held.pop_back();
  for (char* s : held) pool.release(s);
  held.clear();
  // try_acquire: null instead of waiting once the pool is at its budget.
  for (int i = 0; i < 8; ++i) held.push_back(pool.try_acquire());
  EXPECT_EQ(std::count(held.begin(), held.end(), nullptr), 0);
  EXPECT_EQ(pool.try_acquire(), nullptr);
  for (char* s : held) pool.release(s);
  held.clear();
  StagingPool eager(8 * 8192, 8192);
  EXPECT_EQ(eager.slab_count(), 8u);
}

// Slabs of whole 2 MiB pages start at 2 MiB boundaries (so that the huge-page advice can
// take), others at kDirectIoAlignment; every byte is usable, whether touched when made or
// by its first use, and a reused slab keeps what was written into it.
TEST(StagingPool, SlabsAreAlignedAndWholeForEitherFirstTouch) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  for (const auto touch : {StagingPool::FirstTouch::kNow, StagingPool::FirstTouch::kOnUse})
    for (const std::size_t slab : {kHuge, 2 * kHuge, std::size_t{3} << 20, std::size_t{8192}}) {
      SCOPED_TRACE("slab " + std::to_string(slab));
      StagingPool pool(2 * slab, slab, /*grow=*/false, touch);
      char* a = pool.acquire();
      char* b = pool.acquire();
      ASSERT_NE(a, nullptr);
      ASSERT_NE(b, nullptr);
      const std::size_t alignment = slab % kHuge == 0 ? kHuge : kDirectIoAlignment;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % alignment, 0u);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % alignment, 0u);
      if (touch == StagingPool::FirstTouch::kNow) {
        EXPECT_EQ(a[0], 0);
        EXPECT_EQ(a[slab - 1], 0);
      }
      std::memset(a, 0x5a, slab);
      std::memset(b, 0xa5, slab);
      pool.release(a);
      char* again = pool.acquire();
      EXPECT_EQ(again, a);
      EXPECT_EQ(again[slab - 1], 0x5a);
      pool.release(again);
      pool.release(b);
    }
}

}  // namespace
}  // namespace distckpt::internal_storage
