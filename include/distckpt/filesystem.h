/// The file-system interface under every storage backend.
///
/// The POSIX implementation is what production uses; tests wrap it to inject faults
/// (short writes, ENOSPC, EIO on fsync, crashes at chosen points). Custom
/// implementations must be thread-safe: distinct files may be used from different
/// threads at once. Every call returns a Status naming the path and the operation.
///
/// Every call here is local (no MPI). A FileSystem may be used by any number of threads
/// at once. A file object is used by one thread at a time, except ReadableFile::read_at,
/// read_batch and size, which (like pread) any number of threads may call at once on one
/// file. Buffers passed in are borrowed for the call. Errors, unless a function says
/// more: kIoError with the errno's text for a failed system call, kNotFound where the
/// path (or a directory on it) does not exist, kAlreadyExists for create_dir of an
/// existing directory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/status.h"

namespace distckpt {

/// Alignment of buffers, offsets and lengths for direct I/O (a multiple of every
/// logical block size in common use).
inline constexpr std::size_t kDirectIoAlignment = 4096;

struct WriteOpenOptions {
  /// Ask for direct I/O (O_DIRECT): writes bypass the page cache. Only a hint: a file
  /// system that refuses it gives a buffered file (see WritableFile::direct()).
  bool direct_io = false;
  /// Truncate an existing file (the default); false opens it as it is, for writing into
  /// parts of a file laid out by someone else (an HDF5 file's datasets).
  bool truncate = true;
  /// Open the file for reading too, so that map_for_write may map it (a memory file
  /// system's file that a save writes through a mapping).
  bool mappable = false;
  /// The caller writes only from buffers it reuses, which the kernel has copied out of
  /// before (an async save's staging slabs), so where buffered writes bounce (a VM whose
  /// kernel traps on its first touch of each page: docs/design.md "Where it must be
  /// fast") the POSIX file writes straight from them. A hint: a slab's first write pays
  /// the trap once, its later ones nothing, where a bounce would copy every time.
  bool from_reused_buffers = false;
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Writes all `n` bytes at `offset` (retrying short writes); kIoError on failure.
  /// On a direct() file, `data`, `n` and `offset` must be multiples of kDirectIoAlignment.
  virtual Status write_at(const void* data, std::size_t n, uint64_t offset) = 0;
  /// Whether writes bypass the page cache.
  virtual bool direct() const { return false; }
  /// Sets the file's size (used to drop the padding of a final aligned direct write).
  virtual Status truncate(uint64_t length) = 0;
  /// The file's first `size` bytes as memory the caller writes into directly, where that is
  /// cheaper than write_at and cannot fail: a memory file system (tmpfs) whose file already
  /// has every page of its `size` bytes (a recycled spare, storage/spare_files.h), so no
  /// write allocates one. nullptr otherwise, and always from the default: the caller then
  /// uses write_at. The file's size must be `size` (truncate first). The memory is valid
  /// until close() or destruction and is written by the caller's thread; the file must
  /// have been opened with WriteOpenOptions::mappable. Fails only when the file cannot be
  /// examined (fstat).
  virtual Result<char*> map_for_write(uint64_t size) {
    (void)size;
    return static_cast<char*>(nullptr);
  }
  /// Flushes data and metadata to stable storage (fsync).
  virtual Status sync() = 0;
  virtual Status close() = 0;
};

/// One read of a batch: exactly `n` bytes at `offset` into `data` (the caller's memory).
struct ReadRequest {
  void* data = nullptr;
  std::size_t n = 0;
  uint64_t offset = 0;
};

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  /// Reads exactly `n` bytes at `offset`; kCorruption if the file ends first.
  virtual Status read_at(void* data, std::size_t n, uint64_t offset) const = 0;
  virtual Result<uint64_t> size() const = 0;
  /// Reads every request (many small scattered pieces: a load's runs under 4 KiB), in any
  /// order; returns the first error (then some requests may not be filled). The default
  /// calls read_at for each; the POSIX file submits them together through io_uring where
  /// the kernel allows it. Same thread rules as read_at.
  virtual Status read_batch(std::span<const ReadRequest> requests) const {
    for (const ReadRequest& r : requests)
      if (Status st = read_at(r.data, r.n, r.offset); !st.ok()) return st;
    return Status();
  }
  /// How read_batch reads: "io_uring" or "pread" (the POSIX file decides once per thread,
  /// when it first batches: io_uring unless the kernel refuses it or DISTCKPT_IO_URING=0).
  virtual std::string_view batch_method() const { return "pread"; }
  /// Whether read_direct may be used: the POSIX file opens a second descriptor with
  /// O_DIRECT on the first call (never on a memory file system, where the page cache is
  /// the storage), and says false when the file system refuses it. The default: false.
  /// Thread-safe.
  virtual bool can_read_direct() const { return false; }
  /// Reads up to `n` bytes at `offset` into `data` past the page cache (O_DIRECT); `data`,
  /// `n` and `offset` are multiples of kDirectIoAlignment. Returns the bytes read: fewer
  /// than `n` only where the file ends. kUnsupported when direct reads cannot be had (or
  /// the file system refuses this alignment: the caller then reads with read_at),
  /// kIoError naming the path. Same thread rules as read_at.
  virtual Result<std::size_t> read_direct(void* data, std::size_t n, uint64_t offset) const {
    (void)data, (void)n, (void)offset;
    return unsupported("direct reads are not supported by this file");
  }
  /// Best effort, for choosing between read_direct and read_at: the fraction (0 to 1) of
  /// the file's bytes found in the page cache, from samples spread over the file (mincore
  /// of a mapping: no I/O); -1 when unknown (the default). Thread-safe.
  virtual double cached_fraction() const { return -1; }
};

struct DirEntry {
  std::string name;
  bool is_dir = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  /// Creates or truncates `path`.
  virtual Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path,
                                                              const WriteOpenOptions& options = {}) = 0;
  virtual Result<std::unique_ptr<ReadableFile>> open_readable(const std::string& path) = 0;
  /// Creates one directory; kAlreadyExists if it exists.
  virtual Status create_dir(const std::string& path) = 0;
  /// Creates a directory and its missing parents; ok if it exists.
  virtual Status create_dirs(const std::string& path) = 0;
  /// rename(2): atomic replacement of a file. Callers never rename a directory onto an
  /// existing one (POSIX would replace an empty target).
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  /// Renames `from` to `to` only if `to` does not exist, atomically where the file system
  /// allows it; kAlreadyExists otherwise. The default checks, then renames (racy); the
  /// POSIX implementation uses renameat2(RENAME_NOREPLACE).
  virtual Status rename_no_replace(const std::string& from, const std::string& to) {
    if (exists(to)) return already_exists("rename '" + from + "' -> '" + to + "': target exists");
    return rename(from, to);
  }
  virtual Status remove_file(const std::string& path) = 0;
  /// A second name for an existing file (link(2)): `to` must not exist. Lets a checkpoint
  /// be committed twice without writing its bytes again (the manager's best copies).
  /// The default cannot: kUnsupported (callers then copy).
  virtual Status link_file(const std::string& from, const std::string& to) {
    return unsupported("link '" + from + "' -> '" + to + "': not supported by this file system");
  }
  virtual Status remove_all(const std::string& path) = 0;
  virtual Result<std::vector<DirEntry>> list_dir(const std::string& path) = 0;
  /// True if `path` exists (a symlink counts, even dangling); false on any error.
  virtual bool exists(const std::string& path) = 0;
  virtual Result<uint64_t> file_size(const std::string& path) = 0;
  /// fsync of a directory, so that entries created or renamed in it are durable.
  virtual Status sync_dir(const std::string& path) = 0;
  /// fsync of an existing file written by someone else (HDF5 writes its own files).
  virtual Status sync_file(const std::string& path) = 0;
  /// Best effort: drops the file's clean pages from the operating system's cache, so that
  /// the next reads come from storage (verify --deep). The default cannot: kUnsupported.
  virtual Status evict_cached(const std::string& path) {
    return unsupported("evict '" + path + "' from the cache: not supported by this file system");
  }
  /// Appends `data` to `path` (created owner-only if missing) in one write, then fsyncs
  /// it (stats.jsonl). The default cannot: kUnsupported.
  virtual Status append_synced(const std::string& path, const std::string& data) {
    (void)data;
    return unsupported("append to '" + path + "': not supported by this file system");
  }
  /// The last modification time of `path` by the file system's own clock, in
  /// nanoseconds since the epoch: comparing it with that of a file just written measures
  /// an age without trusting any host's clock (garbage collection of abandoned saves).
  /// The default cannot: kUnsupported.
  virtual Result<int64_t> modified_time_ns(const std::string& path) {
    return unsupported("modification time of '" + path + "': not supported by this file system");
  }
};

/// The process-wide POSIX file system (thread-safe, never null, not owned by the caller).
std::shared_ptr<FileSystem> posix_filesystem();

/// Convenience: whole-file read / write-then-fsync through `fs`. A file larger than
/// `max_bytes` is refused with kCorruption instead of being allocated.
Result<std::string> read_whole_file(FileSystem& fs, const std::string& path,
                                    uint64_t max_bytes = uint64_t{4} << 30);
Status write_file_synced(FileSystem& fs, const std::string& path, const std::string& data);

}  // namespace distckpt
