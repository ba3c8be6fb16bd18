// Write mappings (storage/write_maps.h): which files are written through a mapping, that
// the mapping is kept and found again, that the bytes and CRCs are the file's, and that
// the memory of removed files goes back.
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "storage/spare_files.h"
#include "storage/stream_writer.h"
#include "storage/write_maps.h"
#include "test_util.h"
#include "transform/crc32c.h"

namespace distckpt::internal_storage {
namespace {

namespace fs = std::filesystem;

// A directory on tmpfs (/dev/shm), or "" where there is none.
class TmpfsDir {
 public:
  TmpfsDir() {
    struct statfs s;
    if (::statfs("/dev/shm", &s) != 0 || s.f_type != TMPFS_MAGIC) return;
    std::string tmpl = "/dev/shm/distckpt-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TmpfsDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

#define REQUIRE_TMPFS(dir)                                                                              \
  if ((dir).path().empty())                                                                             \
  GTEST_SKIP() << "cannot run: /dev/shm is not a tmpfs here, and only tmpfs files are written through " \
                  "mappings"

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string pattern(std::size_t n, int seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + static_cast<std::size_t>(seed) * 17) % 251);
  return s;
}

// Writes `bytes` into `path` with write_at (a file every page of which exists).
void write_plain(FileSystem& fs, const std::string& path, const std::string& bytes) {
  auto f = fs.open_writable(path);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->write_at(bytes.data(), bytes.size(), 0).ok());
  ASSERT_TRUE((*f)->close().ok());
}

// How a save opens a spare it took: as it is, for writing through a mapping.
WriteOpenOptions spare_options() {
  WriteOpenOptions o;
  o.mappable = true;
  o.truncate = false;
  return o;
}

ino_t inode_of(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_ino;
}

TEST(WriteMaps, OnlyWholeTmpfsFilesOpenedMappableAreMapped) {
  TmpfsDir dir;
  REQUIRE_TMPFS(dir);
  drop_write_mappings();
  auto fs = posix_filesystem();
  constexpr std::size_t kBytes = 3 * 4096 + 100;
  const WriteOpenOptions mappable = spare_options();
  // A new file: its pages do not exist (a write fault would allocate them, and a full
  // tmpfs answers that with SIGBUS): written with write_at instead.
  {
    auto f = fs->open_writable(dir.path() + "/new", mappable);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->truncate(kBytes).ok());
    auto view = (*f)->map_for_write(kBytes);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(*view, nullptr) << "a file with holes must not be written through a mapping";
  }
  // A file whose pages all exist, but of another size than asked: not mapped.
  write_plain(*fs, dir.path() + "/whole", pattern(kBytes, 1));
  {
    auto f = fs->open_writable(dir.path() + "/whole", mappable);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*(*f)->map_for_write(kBytes + 1), nullptr);
  }
  // Not opened mappable: never mapped.
  {
    WriteOpenOptions plain;
    plain.truncate = false;
    auto f = fs->open_writable(dir.path() + "/whole", plain);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*(*f)->map_for_write(kBytes), nullptr);
  }
  // Not on tmpfs: never mapped.
  testing::TempDir disk;
  struct statfs s;
  ASSERT_EQ(::statfs(disk.path().c_str(), &s), 0);
  if (s.f_type != TMPFS_MAGIC) {
    write_plain(*fs, disk.path() + "/whole", pattern(kBytes, 1));
    auto f = fs->open_writable(disk.path() + "/whole", mappable);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*(*f)->map_for_write(kBytes), nullptr) << disk.path() << " is no tmpfs";
  }
  EXPECT_EQ(kept_write_mappings(), 0u);
  // The whole tmpfs file of the size asked: mapped, written through, kept, and found
  // again by the next open of the same file.
  const std::string second = pattern(kBytes, 2);
  char* first_view = nullptr;
  {
    auto f = fs->open_writable(dir.path() + "/whole", mappable);
    ASSERT_TRUE(f.ok());
    auto view = (*f)->map_for_write(kBytes);
    ASSERT_TRUE(view.ok());
    ASSERT_NE(*view, nullptr);
    first_view = *view;
    copy_into_mapping(*view, second.data(), second.size());
    ASSERT_TRUE((*f)->close().ok());
  }
  EXPECT_EQ(read_file(dir.path() + "/whole"), second);
  EXPECT_EQ(kept_write_mappings(), 1u);
  fs::rename(dir.path() + "/whole", dir.path() + "/renamed");  // a spare taken again has another name
  const std::string third = pattern(kBytes, 3);
  {
    auto f = fs->open_writable(dir.path() + "/renamed", mappable);
    ASSERT_TRUE(f.ok());
    auto view = (*f)->map_for_write(kBytes);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(*view, first_view) << "the kept mapping of the same file";
    copy_into_mapping(*view, third.data(), third.size());
  }
  EXPECT_EQ(read_file(dir.path() + "/renamed"), third);
  EXPECT_EQ(kept_write_mappings(), 1u);
  // Sized again (a save whose file is smaller): mapped again at the new size, never
  // past the file's end.
  {
    auto f = fs->open_writable(dir.path() + "/renamed", mappable);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->truncate(2 * 4096).ok());
    auto view = (*f)->map_for_write(2 * 4096);
    ASSERT_TRUE(view.ok());
    ASSERT_NE(*view, nullptr);
    copy_into_mapping(*view, second.data(), 2 * 4096);
  }
  EXPECT_EQ(read_file(dir.path() + "/renamed"), second.substr(0, 2 * 4096));
  EXPECT_EQ(kept_write_mappings(), 1u);
  // Removed: its pages go back once pruned (they would live as long as the mapping).
  fs::remove(dir.path() + "/renamed");
  prune_write_mappings();
  EXPECT_EQ(kept_write_mappings(), 0u);
}

TEST(WriteMaps, KeptMappingsAreBoundedAndDropped) {
  TmpfsDir dir;
  REQUIRE_TMPFS(dir);
  drop_write_mappings();
  auto fs = posix_filesystem();
  const WriteOpenOptions mappable = spare_options();
  for (std::size_t i = 0; i < kMaxKept + 3; ++i) {
    const std::string path = dir.path() + "/f" + std::to_string(i);
    write_plain(*fs, path, pattern(4096, static_cast<int>(i)));
    auto f = fs->open_writable(path, mappable);
    ASSERT_TRUE(f.ok());
    ASSERT_NE(*(*f)->map_for_write(4096), nullptr);
  }
  EXPECT_EQ(kept_write_mappings(), kMaxKept);
  drop_write_mappings();
  EXPECT_EQ(kept_write_mappings(), 0u);
}

// Streaming stores at every alignment of source and destination and lengths around the
// 64-byte step: the same bytes as memcpy, nothing written outside.
TEST(WriteMaps, CopyIntoMappingMatchesMemcpy) {
  const std::string src = pattern(1000, 7);
  for (std::size_t dst_off = 0; dst_off < 20; ++dst_off)
    for (std::size_t src_off = 0; src_off < 20; src_off += 3)
      for (std::size_t n : {0ul, 1ul, 15ul, 16ul, 63ul, 64ul, 65ul, 127ul, 128ul, 129ul, 700ul}) {
        std::vector<char> dst(1100, 'x');
        copy_into_mapping(dst.data() + dst_off, src.data() + src_off, n);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_off && i < dst_off + n;
          ASSERT_EQ(dst[i], inside ? src[src_off + i - dst_off] : 'x')
              << "dst_off " << dst_off << " src_off " << src_off << " n " << n << " at " << i;
        }
      }
}

// A stream written through a mapping: the bytes and the per-chunk CRCs of the file.
TEST(WriteMaps, StreamThroughAMappingGivesTheFileItsBytesAndCrcs) {
  TmpfsDir dir;
  REQUIRE_TMPFS(dir);
  drop_write_mappings();
  auto fs = posix_filesystem();
  // Chunks with gaps between them (a data file's 64-byte starts) and without.
  const std::vector<ByteRange> ranges{{0, 1}, {64, 4096}, {4096, 4097}, {4160, 20000}, {20032, 70001}};
  const uint64_t size = ranges.back().end;
  const std::string bytes = pattern(size, 9);
  const std::string path = dir.path() + "/data";
  write_plain(*fs, path, pattern(size, 1));  // a spare's old bytes
  for (bool checksum : {true, false}) {
    const WriteOpenOptions mappable = spare_options();
    auto f = fs->open_writable(path, mappable);
    ASSERT_TRUE(f.ok());
    auto view = (*f)->map_for_write(size);
    ASSERT_TRUE(view.ok());
    ASSERT_NE(*view, nullptr);
    StreamWriter writer(std::move(*f), *view, ranges, path, checksum);
    // Pieces that straddle chunk ends.
    for (std::size_t at = 0; at < bytes.size(); at += 3000)
      ASSERT_TRUE(writer.append(bytes.data() + at, std::min<std::size_t>(3000, bytes.size() - at)).ok());
    EXPECT_FALSE(writer.append("x", 1).ok()) << "past the file's size";
    auto crcs = writer.finish(true);
    ASSERT_TRUE(crcs.ok()) << crcs.status().to_string();
    ASSERT_EQ(crcs->size(), ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const ByteRange& r = ranges[i];
      const uint32_t expected = checksum ? internal_transform::crc32c_finish(internal_transform::crc32c_extend(
                                               internal_transform::kCrc32cInit, bytes.data() + r.begin, r.end - r.begin))
                                         : 0;
      EXPECT_EQ((*crcs)[i], expected) << "chunk " << i << ": its bytes only, not the gap before it";
    }
    EXPECT_EQ(read_file(path), bytes);
  }
  // A stream that ends short is an error, not a file with old bytes in it.
  const WriteOpenOptions mappable = spare_options();
  auto f = fs->open_writable(path, mappable);
  ASSERT_TRUE(f.ok());
  auto view = (*f)->map_for_write(size);
  ASSERT_NE(*view, nullptr);
  StreamWriter writer(std::move(*f), *view, ranges, path, true);
  ASSERT_TRUE(writer.append(bytes.data(), 100).ok());
  EXPECT_FALSE(writer.finish(false).ok());
}

// take_spare gives a writer first the spare this process wrote through a mapping of
// the size asked (writing it again is a memcpy), otherwise the best fit.
TEST(WriteMaps, SparesThisProcessMappedAreTakenFirst) {
  TmpfsDir dir;
  REQUIRE_TMPFS(dir);
  drop_write_mappings();
  auto fs = posix_filesystem();
  const std::string spares = dir.path() + "/spares";
  ASSERT_TRUE(fs->create_dir(spares).ok());  // owner-only
  constexpr std::size_t kBytes = 8192;
  for (const char* name : {"a", "b", "c"}) write_plain(*fs, spares + "/" + name, pattern(kBytes, 1));
  write_plain(*fs, spares + "/small", pattern(kBytes / 2, 1));
  // "b" was written through a kept mapping; "small" too, at its own size.
  for (auto [name, bytes] : {std::pair<const char*, std::size_t>{"b", kBytes}, {"small", kBytes / 2}}) {
    const WriteOpenOptions mappable = spare_options();
    auto f = fs->open_writable(spares + "/" + name, mappable);
    ASSERT_TRUE(f.ok());
    ASSERT_NE(*(*f)->map_for_write(bytes), nullptr);
  }
  EXPECT_EQ(kept_write_mappings(), 2u);
  const ino_t mapped = inode_of(spares + "/b");
  ASSERT_TRUE(take_spare(*fs, spares, dir.path() + "/taken1", kBytes));
  EXPECT_EQ(inode_of(dir.path() + "/taken1"), mapped);
  // Then the best fit among the others (a full-size one, not the small one).
  ASSERT_TRUE(take_spare(*fs, spares, dir.path() + "/taken2", kBytes));
  EXPECT_EQ(fs::file_size(dir.path() + "/taken2"), kBytes);
  // Dropping the spares prunes the mappings of those removed ("small"); the taken one
  // stays kept.
  drop_spares(*fs, spares);
  EXPECT_EQ(kept_write_mappings(), 1u);
  fs::remove(dir.path() + "/taken1");
  prune_write_mappings();
  EXPECT_EQ(kept_write_mappings(), 0u);
}

// A forked child (a data loader's worker) inherits neither the kept mappings nor their
// descriptors: it cannot keep a removed file's pages alive.
TEST(WriteMaps, AForkedChildKeepsNoMapping) {
  TmpfsDir dir;
  REQUIRE_TMPFS(dir);
  drop_write_mappings();
  auto fs = posix_filesystem();
  const std::string path = dir.path() + "/data";
  write_plain(*fs, path, pattern(4096, 1));
  const WriteOpenOptions mappable = spare_options();
  {
    auto f = fs->open_writable(path, mappable);
    ASSERT_TRUE(f.ok());
    ASSERT_NE(*(*f)->map_for_write(4096), nullptr);
  }
  ASSERT_EQ(kept_write_mappings(), 1u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // No descriptor of the file may be open here, and no mapping kept.
    int open_of_file = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      struct stat fd_st;
      if (::stat(e.path().c_str(), &fd_st) == 0 && fd_st.st_ino == st.st_ino && fd_st.st_dev == st.st_dev) ++open_of_file;
    }
    ::_exit(kept_write_mappings() == 0 && open_of_file == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child kept the mapping or its descriptor";
  EXPECT_EQ(kept_write_mappings(), 1u) << "the parent keeps its own";
  drop_write_mappings();
}

}  // namespace
}  // namespace distckpt::internal_storage
