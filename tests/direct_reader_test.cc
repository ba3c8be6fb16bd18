#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/bounce.h"
#include "storage/direct_reader.h"
#include "storage/staging.h"
#include "test_util.h"

namespace distckpt::internal_storage {
namespace {

std::string random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool on_memory_file_system(const std::string& dir) {
  struct statfs s;
  return ::statfs(dir.c_str(), &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC);
}

// A file through another ReadableFile, counting how it is read and failing on demand.
class CountingFile final : public ReadableFile {
 public:
  CountingFile(const ReadableFile& base, bool direct) : base_(base), direct_(direct) {}
  Status read_at(void* data, std::size_t n, uint64_t offset) const override {
    ++buffered_reads;
    return base_.read_at(data, n, offset);
  }
  Result<uint64_t> size() const override { return base_.size(); }
  bool can_read_direct() const override { return direct_; }
  Result<std::size_t> read_direct(void* data, std::size_t n, uint64_t offset) const override {
    ++direct_reads;
    if (refuse_alignment) return unsupported("O_DIRECT: Invalid argument (injected)");
    if (fail_after >= 0 && direct_reads > fail_after) return io_error("read 'x': Input/output error (injected)");
    // As O_DIRECT would: only whole aligned blocks are asked for.
    EXPECT_EQ(n % kDirectIoAlignment, 0u);
    EXPECT_EQ(offset % kDirectIoAlignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % kDirectIoAlignment, 0u);
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, base_.size());
    const uint64_t got = offset >= size ? 0 : std::min<uint64_t>(n, size - offset);
    DISTCKPT_RETURN_IF_ERROR(base_.read_at(data, got, offset));
    return static_cast<std::size_t>(got);
  }
  mutable int buffered_reads = 0, direct_reads = 0;
  bool refuse_alignment = false;
  int fail_after = -1;

 private:
  const ReadableFile& base_;
  bool direct_;
};

struct Files {
  std::vector<std::string> contents;
  std::vector<std::unique_ptr<ReadableFile>> opened;
  std::vector<std::unique_ptr<CountingFile>> counted;
};

// Two files of unaligned sizes; ranges of every kind: within one page, sharing a page
// with the next one, spanning several slabs, ending at the file's last byte.
Files make_files(const std::string& dir, bool direct) {
  Files f;
  f.contents = {random_bytes(300'001, 1), random_bytes(70'003, 2)};
  for (std::size_t i = 0; i < f.contents.size(); ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    write_file(path, f.contents[i]);
    auto opened = posix_filesystem()->open_readable(path);
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    f.opened.push_back(std::move(opened).value());
    f.counted.push_back(std::make_unique<CountingFile>(*f.opened.back(), direct));
  }
  return f;
}

std::vector<DirectRange> make_ranges(const Files& f, std::vector<std::string>& dst) {
  const std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> spots = {
      {0, 10, 100},        {0, 200, 3000},    {0, 4000, 200},     {0, 9000, 150'000},
      {0, 170'000, 64},    {0, 250'000, 50'001}, {1, 0, 4096},    {1, 4096, 1},
      {1, 20'000, 50'003}};
  std::vector<DirectRange> ranges;
  dst.assign(spots.size(), std::string());
  for (std::size_t i = 0; i < spots.size(); ++i) {
    const auto [file, offset, n] = spots[i];
    EXPECT_LE(offset + n, f.contents[file].size());
    dst[i].assign(n, '\0');
    ranges.push_back(DirectRange{file, offset, n, dst[i].data()});
  }
  return ranges;
}

// Every range arrives whole, in pieces that follow each other, each handed over after
// its copy; through slabs far smaller than some ranges.
TEST(DirectReader, EveryRangeArrivesWholeAndInOrder) {
  testing::TempDir tmp;
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct" : "through read_at");
    Files f = make_files(tmp.path(), direct);
    std::vector<std::string> dst;
    const std::vector<DirectRange> ranges = make_ranges(f, dst);
    StagingPool pool(3 * 16384, 16384, /*grow=*/true, StagingPool::FirstTouch::kOnUse);
    std::vector<uint64_t> next(ranges.size(), 0);
    std::size_t last_range = 0;
    const Status st = read_ranges(
        ranges, [&](uint32_t file) -> Result<const ReadableFile*> { return f.counted[file].get(); },
        [&](std::size_t r, uint64_t at, const char* piece, std::size_t n) -> Status {
          EXPECT_GE(r, last_range);  // ranges in order
          last_range = r;
          EXPECT_EQ(at, next[r]);  // pieces in order, none missing
          EXPECT_EQ(piece, ranges[r].dst + at);
          EXPECT_EQ(std::memcmp(piece, f.contents[ranges[r].file].data() + ranges[r].offset + at, n), 0);
          next[r] = at + n;
          return Status();
        },
        [](std::size_t r) { return "range " + std::to_string(r); }, pool);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      EXPECT_EQ(next[r], ranges[r].n) << r;
      EXPECT_EQ(dst[r], f.contents[ranges[r].file].substr(ranges[r].offset, ranges[r].n)) << r;
    }
    if (direct) {
      EXPECT_GT(f.counted[0]->direct_reads, 0);
      EXPECT_EQ(f.counted[0]->buffered_reads, 0);
    } else {
      EXPECT_EQ(f.counted[0]->direct_reads, 0);
    }
    EXPECT_LE(pool.slab_count(), 3u);
  }
}

// A file system that refuses the alignment (O_DIRECT's EINVAL) is read through the
// page cache instead, and the bytes are the same.
TEST(DirectReader, RefusedAlignmentFallsBackToBufferedReads) {
  testing::TempDir tmp;
  Files f = make_files(tmp.path(), true);
  for (auto& c : f.counted) c->refuse_alignment = true;
  std::vector<std::string> dst;
  const std::vector<DirectRange> ranges = make_ranges(f, dst);
  StagingPool pool(2 * 16384, 16384, true, StagingPool::FirstTouch::kOnUse);
  const Status st = read_ranges(
      ranges, [&](uint32_t file) -> Result<const ReadableFile*> { return f.counted[file].get(); },
      [](std::size_t, uint64_t, const char*, std::size_t) { return Status(); }, [](std::size_t) { return ""; }, pool);
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (std::size_t r = 0; r < ranges.size(); ++r)
    EXPECT_EQ(dst[r], f.contents[ranges[r].file].substr(ranges[r].offset, ranges[r].n)) << r;
  EXPECT_EQ(f.counted[0]->direct_reads, 1);  // refused once, then never asked again
  EXPECT_GT(f.counted[0]->buffered_reads, 0);
}

// Errors stop the reads and reach the caller, with every slab back in the pool: a read
// error, a file shorter than its ranges (named by the caller's names), a failing check,
// a file that cannot be opened. A pool of 2 slabs makes the reader wait for each.
TEST(DirectReader, ErrorsStopTheReadsAndReachTheCaller) {
  testing::TempDir tmp;
  const auto run = [&](Files& f, const std::vector<DirectRange>& ranges, int fail_check_at, bool fail_open) {
    StagingPool pool(2 * 8192, 8192, false, StagingPool::FirstTouch::kOnUse);
    int pieces = 0;
    const Status st = read_ranges(
        ranges,
        [&](uint32_t file) -> Result<const ReadableFile*> {
          if (fail_open && file == 1) return not_found("data file 'f1' is missing");
          return f.counted[file].get();
        },
        [&](std::size_t, uint64_t, const char*, std::size_t) -> Status {
          return ++pieces == fail_check_at ? corruption("crc32c mismatch (injected)") : Status();
        },
        [](std::size_t r) { return "chunk " + std::to_string(r); }, pool);
    // Both slabs are free again: neither is held by the stopped reader nor the queue.
    EXPECT_NE(pool.try_acquire(), nullptr);
    EXPECT_NE(pool.try_acquire(), nullptr);
    return st;
  };
  {
    Files f = make_files(tmp.path(), true);
    f.counted[0]->fail_after = 2;
    std::vector<std::string> dst;
    const Status st = run(f, make_ranges(f, dst), -1, false);
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.to_string();
    EXPECT_EQ(f.counted[0]->direct_reads, 3);  // nothing read after the error
  }
  {
    Files f = make_files(tmp.path(), true);
    std::vector<std::string> dst(1, std::string(5000, '\0'));
    const std::vector<DirectRange> beyond{{1, 70'003 - 100, 5000, dst[0].data()}};
    const Status st = run(f, beyond, -1, false);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
    EXPECT_NE(st.message().find("chunk 0: the file ends at byte 70003"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.to_string();
  }
  {
    Files f = make_files(tmp.path(), true);
    std::vector<std::string> dst;
    const Status st = run(f, make_ranges(f, dst), 3, false);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  }
  {
    Files f = make_files(tmp.path(), true);
    std::vector<std::string> dst;
    const Status st = run(f, make_ranges(f, dst), -1, true);
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  }
}

// The POSIX file: direct reads where the file system takes O_DIRECT (not on a memory
// file system), whole aligned blocks with a short count only at the end of the file;
// and the page-cache estimate that tells a file just written through the cache from one
// evicted.
TEST(DirectReader, PosixFileReadsDirectlyAndKnowsWhatIsCached) {
  testing::TempDir tmp;
  if (on_memory_file_system(tmp.path()))
    GTEST_SKIP() << tmp.path() << " is on a memory file system, where the POSIX file never reads directly; "
                 << "set TMPDIR to a disk-backed directory to run this test";
  const std::string path = tmp.path() + "/data";
  const std::string bytes = random_bytes(3 * 4096 + 100, 7);
  write_file(path, bytes);
  auto file = posix_filesystem()->open_readable(path);
  ASSERT_TRUE(file.ok());
  if (!(*file)->can_read_direct())
    GTEST_SKIP() << "the file system under " << tmp.path() << " refuses O_DIRECT";
  StagingPool pool(2 * 16384, 16384, false, StagingPool::FirstTouch::kNow);
  char* slab = pool.acquire();
  auto got = (*file)->read_direct(slab, 16384, 0);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, bytes.size());
  EXPECT_EQ(std::string(slab, *got), bytes);
  got = (*file)->read_direct(slab, 4096, 8192);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 4096u);
  EXPECT_EQ(std::string(slab, 4096), bytes.substr(8192, 4096));
  got = (*file)->read_direct(slab, 4096, 16384);  // past the end
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
  pool.release(slab);

  // Just written through the page cache: cached. Synced and evicted: not.
  EXPECT_GE((*file)->cached_fraction(), 0.5);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  EXPECT_LT((*file)->cached_fraction(), 0.5);

  // A file put in the place of the one opened is not read by the direct descriptor.
  const std::string other = tmp.path() + "/other";
  write_file(other, bytes);
  auto before = posix_filesystem()->open_readable(other);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(::rename(path.c_str(), other.c_str()), 0);
  EXPECT_FALSE((*before)->can_read_direct());
}

TEST(DirectReader, NeverDirectOnAMemoryFileSystem) {
  if (!on_memory_file_system("/dev/shm")) GTEST_SKIP() << "/dev/shm is not a memory file system here";
  char tmpl[] = "/dev/shm/distckpt-direct-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "abcd", 4), 4);
  ::close(fd);
  auto file = posix_filesystem()->open_readable(tmpl);
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE((*file)->can_read_direct());
  char buf[4096];
  EXPECT_EQ((*file)->read_direct(buf, sizeof buf, 0).status().code(), StatusCode::kUnsupported);
  ::unlink(tmpl);
}


// Buffered reads and writes through the thread's bounce buffer (base/bounce.h) and
// without it (writes from reused buffers never are): every byte lands where it belongs, at any size and offset around the
// buffer's, and a read past the end still says the file is truncated.
TEST(BounceIo, EveryByteEitherWay) {
  testing::TempDir tmp;
  const std::size_t b = internal_base::kBounceBytes;
  const std::vector<std::size_t> sizes = {1, 4095, b - 1, b, b + 1, 3 * b + 4097};
  for (const bool bounce : {true, false}) {
    internal_base::force_bounce_io_for_testing(bounce);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      SCOPED_TRACE("bounce " + std::to_string(bounce) + ", " + std::to_string(sizes[i]) + " bytes");
      const std::string path = tmp.path() + "/f" + std::to_string(i);
      const std::string bytes = random_bytes(sizes[i], static_cast<uint32_t>(i) + (bounce ? 100 : 0));
      const uint64_t at = 513 * i;  // unaligned offsets, a hole before them
      {
        // Odd files are written as from reused buffers (an async save's slabs): never bounced.
        auto file = posix_filesystem()->open_writable(path, WriteOpenOptions{.from_reused_buffers = i % 2 == 1});
        ASSERT_TRUE(file.ok()) << file.status().to_string();
        ASSERT_TRUE((*file)->write_at(bytes.data(), bytes.size(), at).ok());
        ASSERT_TRUE((*file)->close().ok());
      }
      auto file = posix_filesystem()->open_readable(path);
      ASSERT_TRUE(file.ok());
      ASSERT_EQ(*(*file)->size(), at + bytes.size());
      std::string got(bytes.size(), '\0');
      ASSERT_TRUE((*file)->read_at(got.data(), got.size(), at).ok());
      EXPECT_TRUE(got == bytes);
      // One byte more than the file holds: an error naming the file, not a short read.
      std::string over(bytes.size() + 1, '\0');
      const Status past = (*file)->read_at(over.data(), over.size(), at);
      EXPECT_EQ(past.code(), StatusCode::kCorruption);
      EXPECT_NE(past.message().find("truncated file"), std::string::npos) << past.to_string();
      EXPECT_NE(past.message().find(path), std::string::npos) << past.to_string();
      EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), over.begin()));
      EXPECT_EQ(over.back(), '\0');  // nothing copied past what the file holds
    }
  }
  internal_base::force_bounce_io_for_testing(std::nullopt);
}

// A write that cannot go through reports the file system's error, bounced or not.
TEST(BounceIo, WriteErrorsReachTheCaller) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full is not writable here";
  for (const bool bounce : {true, false}) {
    internal_base::force_bounce_io_for_testing(bounce);
    auto file = posix_filesystem()->open_writable("/dev/full", WriteOpenOptions{.truncate = false});
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    const std::string bytes(internal_base::kBounceBytes + 10, 'x');
    const Status s = (*file)->write_at(bytes.data(), bytes.size(), 0);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << "bounce " << bounce;
    EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.to_string();
  }
  internal_base::force_bounce_io_for_testing(std::nullopt);
}

// DISTCKPT_BOUNCE=1 or 0 decides for the process instead of the probe (each case in a
// fresh process: the decision is taken once).
TEST(BounceIoDeathTest, TheEnvironmentDecides) {
  const std::string style = GTEST_FLAG_GET(death_test_style);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("DISTCKPT_BOUNCE", "1", 1);
        std::_Exit(internal_base::bounce_io() ? 3 : 4);
      },
      ::testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        ::setenv("DISTCKPT_BOUNCE", "0", 1);
        std::_Exit(internal_base::bounce_io() ? 3 : 4);
      },
      ::testing::ExitedWithCode(4), "");
  GTEST_FLAG_SET(death_test_style, style);
}

}  // namespace
}  // namespace distckpt::internal_storage
