// The read engine: how the bytes of stored chunks reach memory, checked. One engine for
// every reader: collective load, CheckpointReader (convert, publish), verify.
//
// A load's chunks needed whole are gathered and read past the page cache, as long
// sequential streams into staging slabs of 2 MiB pages (GatheredReads, then
// storage/direct_reader.h), where the file system allows it; everything else (chunks
// needed in part, encrypted chunks, files on a memory file system or mostly cached) is
// read with buffered preads, straight into the caller's buffers where a run is
// contiguous there. Measured here: 4 processes reading 256 MiB each took 0.26-0.34 s
// directly into 2 MiB-page slabs, 0.55-0.97 s buffered, 0.5-0.86 s directly into 4 KiB
// pages (an earlier measurement, 0.85-1.23 s directly against 0.39-0.63 s buffered, had
// slabs of 4 KiB pages and one read per chunk).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/filesystem.h"
#include "distckpt/layout.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}
namespace distckpt::internal_format {

// One read of a stored chunk for a needed box (planned by plan/load_plan.h).
struct ChunkRead {
  int chunk = 0;  // index into the tensor's chunks
  Box region;     // intersection of the chunk's box and the needed box
  bool whole = false;  // the chunk's box equals the needed box: read straight into the buffer
};

// The box of a stored chunk.
Box chunk_box(const proto::Chunk& chunk);

// Before a data file named "rank_<r>/<name>" (a per-rank set) is opened: its directory
// must be a real directory of the checkpoint `dir`, not a symlink (O_NOFOLLOW guards
// only the last component), so that nothing is read from outside it. `dir` is listed
// once, when the first such name is checked.
class InsideCheck {
 public:
  InsideCheck(FileSystem& fs, std::string dir) : fs_(fs), dir_(std::move(dir)) {}
  // kCorruption for a directory that is missing or a symlink; errors of list_dir.
  Status check(const std::string& file_name);

 private:
  FileSystem& fs_;
  std::string dir_;
  std::optional<std::set<std::string>> real_dirs_;
};

// Opens the data files of a checkpoint on demand, checking each one's real size against
// the index, and keeps at most kMaxOpen of them open (least recently used closed
// first): a checkpoint written by thousands of ranks must load under the usual limit of
// 1024 descriptors. `index` is borrowed.
class FileCache {
 public:
  // `dir`: the directory the index's file names are relative to (files_dir).
  FileCache(FileSystem& fs, std::string dir, const proto::Index& index);
  // Where the file lies (a reference: in the checkpoint it names, format.h).
  std::string path(uint32_t file_id) const;
  const std::string& name(uint32_t file_id) const { return index_.files(static_cast<int>(file_id)).name(); }
  // The chunk's file name as its encryption binds it: "" in a single file (whose chunks
  // are bound to their place in it, not to its name).
  std::string identity_name(uint32_t file_id) const;
  // kNotFound ("data file ... is missing"), kCorruption for a size other than recorded.
  Result<const ReadableFile*> get(uint32_t file_id);

 private:
  static constexpr std::size_t kMaxOpen = 64;
  struct Open {
    std::unique_ptr<ReadableFile> file;
    uint64_t last_use;
  };
  FileSystem& fs_;
  std::string dir_;
  const proto::Index& index_;
  bool single_file_;
  InsideCheck inside_;
  InsideCheck referenced_;  // references: <root>/<checkpoint> is a real directory
  std::map<std::string, Status> identities_;  // references: check_reference_identity per checkpoint
  std::map<uint32_t, Open> open_;
  uint64_t clock_ = 0;
};

// How a chunk is checked as it is read.
struct ChunkCheck {
  bool crc = true;  // compare the CRC32C of the stored bytes with the index's
  // Encrypted: authenticate and decrypt (kAuthFailed naming the chunk).
  const internal_transform::CheckpointCipher* cipher = nullptr;
  std::string file_identity;  // FileCache::identity_name of the chunk's file
  std::string where;          // names the chunk in errors
};

// Reads chunk `c` of `t` from `file` whole. With `dst`, into `dst` (the plaintext bytes
// of its box); with dst == nullptr, only to check it, through `scratch` in pieces of at
// most 16 MiB (an encrypted chunk is authenticated whole: memory of its size). The
// CRC32C of each piece is computed right after the piece is read, while it is still in
// cache; it covers the bytes as stored. CBC chunks (padded) are read into `scratch`.
Status read_chunk(const ReadableFile& file, const proto::Tensor& t, int c, void* dst, const ChunkCheck& check,
                  std::vector<char>& scratch);


// How a load reads a chunk's runs under 4 KiB (a split on a trailing dimension), and a
// tally of them.
struct SmallRuns {
  // false: each run read exactly, batched (ReadableFile::read_batch). true: slabs of
  // whole rows read and the runs copied out (data sieving): more bytes, fewer calls.
  bool sieve = false;
  uint64_t runs = 0;        // runs read (batched), or slabs read (sieving)
  std::string_view method;  // "io_uring", "pread" or "sieving"; empty if none was met
};

// Chunks needed whole, gathered by read_into to be read together past the page cache
// (storage/direct_reader.h) by read_gathered: a load's bulk, read as a few long
// sequential streams through 2 MiB-page slabs instead of one buffered pread per chunk.
// Only chunks of files that can read directly and are not mostly in the page cache
// already (there a buffered read straight into the buffer is a memory copy) are gathered.
class GatheredReads {
 public:
  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }
  uint64_t bytes() const { return bytes_; }
  // Whether chunks of this file are gathered: it can read directly and is not mostly
  // cached. Decided once per file; false if the file cannot be opened (read_into's own
  // read then reports why).
  bool reads_directly(FileCache& files, uint32_t file_id);
  // Chunk `chunk` of `t` (borrowed from the index), whole, into `dst`, under the
  // caller's number `tag` (read_gathered hands it back once the chunk is read and checked).
  void add(const proto::Tensor& t, int chunk, char* dst);
  // The tag of the chunks added next.
  int64_t tag = -1;

 private:
  friend Status read_gathered(FileCache& files, GatheredReads& gathered, bool checksums,
                              const std::function<void(int64_t tag)>& on_read, const std::function<void()>& meanwhile,
                              uint64_t* direct_bytes);
  struct Item {
    const proto::Tensor* tensor;
    int chunk;
    char* dst;
    int64_t tag;
  };
  std::vector<Item> items_;
  std::map<uint32_t, bool> direct_files_;
  uint64_t bytes_ = 0;
};

// Reads what read_into gathered (and empties `gathered`), checking each chunk's CRC32C
// when `checksums` (the index has them), as it is copied out of the staging slab. Staging:
// 4 slabs of 8 MiB (2 MiB pages), made as they are first needed, freed on return; one
// reader thread. `on_read` (may be empty) is called with a chunk's tag once it is read
// and checked, and `meanwhile` (may be empty) after each piece of 256 KiB copied: both
// on the caller's thread, while the reader thread keeps reading (a load sends boxes and
// lets messages move there). Errors as read_into's; the buffers of chunks not yet read
// are left as they were. `direct_bytes` (may be null): adds the bytes actually read
// with O_DIRECT. Without memory for the staging, the chunks are read one by one through
// the page cache instead.
Status read_gathered(FileCache& files, GatheredReads& gathered, bool checksums,
                     const std::function<void(int64_t tag)>& on_read = {}, const std::function<void()>& meanwhile = {},
                     uint64_t* direct_bytes = nullptr);

// Fills box `needed` (row-major at `dst`) of stored tensor `t` by `reads` (the chunks
// that overlap it and cover it: callers check coverage first). A chunk needed whole is read whole and checked (CRC32C when the index has
// them); of a chunk needed in part only the bytes of the region are read (its CRC32C
// covers the whole chunk, so it is not checked), unless `check_partial` asks for whole
// chunks. Encrypted chunks (`cipher`) are always read whole and authenticated. Adds to
// *bytes_read. `small`: how runs under 4 KiB are read, and their tally (null: batched).
// `gathered` (not null): chunks needed whole that may be read directly are added to it
// instead of being read now (their bytes are counted now); the caller then calls
// read_gathered before it uses `dst`.
Status read_into(FileCache& files, const proto::Index& index, const proto::Tensor& t,
                 const std::vector<ChunkRead>& reads, const Box& needed, void* dst, std::vector<char>& scratch,
                 uint64_t* bytes_read, bool check_partial, const internal_transform::CheckpointCipher* cipher,
                 SmallRuns* small = nullptr, GatheredReads* gathered = nullptr);

// The zlib CRC-32 of bytes [begin, end) of `file` (MindSpore's .ckpt footer), read in
// pieces of at most 8 MiB.
Result<uint32_t> file_crc32(const ReadableFile& file, uint64_t begin, uint64_t end);

}  // namespace distckpt::internal_format
