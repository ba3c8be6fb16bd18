#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "base/bounce.h"
#include "base/strings.h"
#include "distckpt/filesystem.h"
#include "storage/memory_fs.h"
#include "storage/write_maps.h"

namespace distckpt {

// Writes from the caller's buffers are faster there than direct ones (docs/benchmarks.md).
bool internal_storage::in_memory_file_system(const std::string& dir) {
  struct statfs s;
  if (::statfs(dir.empty() ? "." : dir.c_str(), &s) != 0) return false;
  return s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC;
}

namespace {
using internal_storage::in_memory_file_system;

Status errno_status(const std::string& op, const std::string& path, int err) {
  return io_error(op + " '" + path + "': " + std::strerror(err));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path, bool direct, const WriteOpenOptions& options)
      : fd_(fd), path_(std::move(path)), direct_(direct), mappable_(options.mappable),
        bounce_(!direct && !options.from_reused_buffers) {}
  bool direct() const override { return direct_; }
  Result<char*> map_for_write(uint64_t size) override {
    if (!mappable_ || direct_ || fd_ < 0) return static_cast<char*>(nullptr);
    auto mapping = internal_storage::map_file_for_write(fd_, size);
    if (!mapping.ok()) return mapping.status().with_context("'" + path_ + "'");
    mapping_ = std::move(mapping).value();
    return mapping_ ? mapping_->addr : static_cast<char*>(nullptr);
  }
  Status truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return errno_status("truncate", path_, errno);
    return Status();
  }
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status write_at(const void* data, std::size_t n, uint64_t offset) override {
    const char* p = static_cast<const char*>(data);
    // The kernel copies only out of the bounce buffer, which it has touched before
    // (base/bounce.h). Direct writes, and writes from reused buffers (an async save's
    // staging slabs: WriteOpenOptions::from_reused_buffers), are not bounced.
    if (char* bounce = bounce_ && internal_base::bounce_io_for(n) ? internal_base::bounce_buffer() : nullptr) {
      while (n > 0) {
        const std::size_t piece = std::min(n, internal_base::kBounceBytes);
        std::memcpy(bounce, p, piece);
        DISTCKPT_RETURN_IF_ERROR(write_all(bounce, piece, offset));
        p += piece;
        n -= piece;
        offset += piece;
      }
      return Status();
    }
    return write_all(p, n, offset);
  }
  Status sync() override {
    if (::fsync(fd_) != 0) return errno_status("fsync", path_, errno);
    return Status();
  }
  Status close() override {
    mapping_.reset();  // the kept one stays in storage/write_maps.h's list
    if (fd_ < 0) return Status();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return errno_status("close", path_, errno);
    return Status();
  }

 private:
  Status write_all(const char* p, std::size_t n, uint64_t offset) {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno_status("write", path_, errno);
      }
      if (w == 0) return io_error("write '" + path_ + "': no progress (device full?)");
      p += w;
      n -= static_cast<std::size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status();
  }
  int fd_;
  std::string path_;
  bool direct_;
  bool mappable_;
  bool bounce_;  // buffered, from the caller's memory: bounced where base/bounce.h says so
  std::shared_ptr<internal_storage::WriteMapping> mapping_;  // map_for_write's, while open
};

// io_uring for batches of small reads: one ring per thread (queue depth kRingDepth), made
// when the thread first batches. A kernel that refuses io_uring (seccomp, the
// io_uring_disabled sysctl, an old kernel) or DISTCKPT_IO_URING=0 leaves preads.
class ReadRing {
 public:
  static constexpr unsigned kRingDepth = 128;
  static ReadRing& of_this_thread() {
    thread_local ReadRing ring;
    return ring;
  }
  bool usable() const { return ready_; }
  ~ReadRing() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  // Submits up to kRingDepth reads of `fd` and waits for every one submitted. For each
  // request, `done[i]` gets the bytes read or -errno (0 if never submitted). Returns 0, or
  // -errno when the ring failed: it is then retired on this thread and the caller reads
  // with preads. Every completion of what was submitted is reaped before returning, so no
  // read is in flight afterwards; only a wait that fails with another error than EINTR or
  // EAGAIN (not seen in practice) retires the ring at once, whose teardown cancels them.
  int run(int fd, std::span<const ReadRequest> requests, std::vector<int64_t>& done) {
    done.assign(requests.size(), 0);
    // The submission queue is empty between calls (everything is submitted or the ring is
    // retired) and a batch is at most kRingDepth, so every request gets an entry.
    unsigned prepared = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      io_uring_prep_read(sqe, fd, requests[i].data, static_cast<unsigned>(requests[i].n), requests[i].offset);
      io_uring_sqe_set_data64(sqe, i);
      ++prepared;
    }
    int submitted = 0;
    do {
      submitted = io_uring_submit(&ring_);
    } while (submitted == -EINTR);
    if (submitted < 0) return retire(submitted);  // nothing in flight: the entries are dropped with the ring
    for (int reaped = 0; reaped < submitted;) {
      io_uring_cqe* cqe = nullptr;
      const int w = io_uring_wait_cqe(&ring_, &cqe);
      if (w == -EINTR || w == -EAGAIN) continue;
      if (w < 0) return retire(w);
      const uint64_t i = io_uring_cqe_get_data64(cqe);
      if (i < done.size()) done[static_cast<std::size_t>(i)] = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      ++reaped;
    }
    if (static_cast<unsigned>(submitted) < prepared || prepared < requests.size()) return retire(-EAGAIN);
    return 0;
  }

 private:
  ReadRing() {
    const char* env = std::getenv("DISTCKPT_IO_URING");
    if (env != nullptr && std::string_view(env) == "0") return;
    if (io_uring_queue_init(kRingDepth, &ring_, 0) != 0) return;
    // IORING_OP_READ came with Linux 5.6; older kernels make rings that cannot read.
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    const bool reads = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe != nullptr) io_uring_free_probe(probe);
    if (!reads) {
      io_uring_queue_exit(&ring_);
      return;
    }
    ready_ = true;
  }
  int retire(int err) {
    io_uring_queue_exit(&ring_);
    ready_ = false;
    return err;
  }
  io_uring ring_{};
  bool ready_ = false;
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixReadableFile() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  bool can_read_direct() const override {
    std::call_once(direct_once_, [this] { direct_fd_ = open_direct(); });
    return direct_fd_ >= 0;
  }
  Result<std::size_t> read_direct(void* data, std::size_t n, uint64_t offset) const override {
    if (!can_read_direct()) return unsupported("read '" + path_ + "': direct reads are not available");
    char* p = static_cast<char*>(data);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(direct_fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        // EINVAL: an alignment this file system does not take (a logical block over 4 KiB);
        // EOPNOTSUPP: a file system that opens with O_DIRECT but cannot read so.
        if (errno == EINVAL || errno == EOPNOTSUPP || errno == ENOTSUP)
          return unsupported("read '" + path_ + "' with O_DIRECT: " + std::strerror(errno));
        return errno_status("read", path_, errno);
      }
      if (r == 0) return done;  // the end of the file
      done += static_cast<std::size_t>(r);
      if (done % kDirectIoAlignment != 0) break;
    }
    // A short read that ends unaligned is the end of the file on a local file system;
    // network and FUSE file systems may also return one mid-file: the rest is read
    // through the page cache, up to the end of the file.
    while (done < n) {
      const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno_status("read", path_, errno);
      }
      if (r == 0) break;
      done += static_cast<std::size_t>(r);
    }
    return done;
  }
  Status read_at(void* data, std::size_t n, uint64_t offset) const override {
    char* p = static_cast<char*>(data);
    const uint64_t start = offset;
    // The kernel copies only into the bounce buffer, which it has touched before; ours
    // into the caller's memory (base/bounce.h).
    char* bounce = internal_base::bounce_io_for(n) ? internal_base::bounce_buffer() : nullptr;
    while (n > 0) {
      const std::size_t want = bounce != nullptr ? std::min(n, internal_base::kBounceBytes) : n;
      const ssize_t r = ::pread(fd_, bounce != nullptr ? bounce : p, want, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno_status("read", path_, errno);
      }
      if (bounce != nullptr) std::memcpy(p, bounce, static_cast<std::size_t>(r));
      if (r == 0)
        return corruption("read '" + path_ + "': file ends at byte " + std::to_string(offset) + ", needed " +
                          std::to_string(n) + " more bytes from offset " + std::to_string(start) +
                          " (truncated file)");
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status();
  }
  Result<uint64_t> size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return errno_status("stat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }
  Status read_batch(std::span<const ReadRequest> requests) const override {
    ReadRing& ring = ReadRing::of_this_thread();
    if (!ring.usable()) return ReadableFile::read_batch(requests);  // preads: read_at bounces
    // Where the kernel's first touch of a page traps (base/bounce.h), the ring reads into
    // the thread's bounce buffer, packed, and each piece is copied into place: a batch of
    // 128 pieces under 4 KiB fits it whole.
    std::size_t total = 0;
    for (const ReadRequest& r : requests) total += r.n;
    char* bounce = internal_base::bounce_io_for(total) ? internal_base::bounce_buffer() : nullptr;
    std::vector<int64_t> done;
    std::vector<ReadRequest> packed;
    for (std::size_t at = 0; at < requests.size();) {
      std::size_t count = 0;
      for (std::size_t bytes = 0; at + count < requests.size() && count < ReadRing::kRingDepth; ++count) {
        bytes += requests[at + count].n;
        if (bounce != nullptr && bytes > internal_base::kBounceBytes) break;
      }
      if (count == 0) {  // one piece larger than the bounce buffer: read_at bounces it in turn
        DISTCKPT_RETURN_IF_ERROR(read_at(requests[at].data, requests[at].n, requests[at].offset));
        ++at;
        continue;
      }
      const auto part = requests.subspan(at, count);
      std::span<const ReadRequest> submitted = part;
      if (bounce != nullptr) {
        packed.resize(count);
        for (std::size_t i = 0, used = 0; i < count; used += part[i].n, ++i) packed[i] = {bounce + used, part[i].n, part[i].offset};
        submitted = packed;
      }
      // A ring that failed is retired: preads do this part and the rest. Its teardown may
      // leave reads in flight (ReadRing::run), so a bounce buffer they target is not reused.
      if (ring.run(fd_, submitted, done) < 0) {
        if (bounce != nullptr) internal_base::abandon_bounce_buffer();
        return ReadableFile::read_batch(requests.subspan(at));
      }
      const auto got_of = [&](std::size_t i) { return done[i] > 0 ? static_cast<std::size_t>(done[i]) : std::size_t{0}; };
      if (bounce != nullptr)  // every piece out before a read_at below reuses the buffer
        for (std::size_t i = 0; i < part.size(); ++i) std::memcpy(part[i].data, submitted[i].data, got_of(i));
      for (std::size_t i = 0; i < part.size(); ++i) {
        // A failed read (EINTR, EAGAIN, an opcode the kernel refuses, EIO) is done again by
        // read_at, which reports the error if it persists; a short one (the end of the
        // file, a signal) is finished by it, which says "truncated" at the end.
        const std::size_t got = got_of(i);
        if (got < part[i].n)
          DISTCKPT_RETURN_IF_ERROR(read_at(static_cast<char*>(part[i].data) + got, part[i].n - got, part[i].offset + got));
      }
      at += count;
    }
    return Status();
  }
  std::string_view batch_method() const override {
    return ReadRing::of_this_thread().usable() ? "io_uring" : "pread";
  }

  double cached_fraction() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0 || st.st_size <= 0) return -1;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    // Up to 8 samples of 1 MiB, spread evenly: 2048 pages looked at, whatever the size.
    constexpr uint64_t kSamples = 8, kSample = 1 << 20;
    std::vector<unsigned char> resident(kSample / page + 1);
    uint64_t seen = 0, cached = 0;
    for (uint64_t s = 0; s < kSamples; ++s) {
      const uint64_t at = size <= kSample * kSamples ? s * kSample : (size - kSample) / (kSamples - 1) * s / page * page;
      if (at >= size) break;
      const uint64_t n = std::min(kSample, size - at);
      void* map = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(at));
      if (map == MAP_FAILED) return -1;
      const bool ok = ::mincore(map, n, resident.data()) == 0;
      ::munmap(map, n);
      if (!ok) return -1;
      const uint64_t pages = (n + page - 1) / page;
      for (uint64_t i = 0; i < pages; ++i) cached += resident[i] & 1;
      seen += pages;
    }
    return seen == 0 ? -1 : static_cast<double>(cached) / static_cast<double>(seen);
  }

 private:
  // The same file again with O_DIRECT, or -1. Opened by path, so checked to be the very
  // file of fd_ (same device and inode): a file put in its place since is not read.
  int open_direct() const {
    if (in_memory_file_system(internal_base::dir_name(path_))) return -1;
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_DIRECT);
    if (fd < 0) return -1;
    struct stat mine, theirs;
    if (::fstat(fd_, &mine) != 0 || ::fstat(fd, &theirs) != 0 || mine.st_dev != theirs.st_dev ||
        mine.st_ino != theirs.st_ino) {
      ::close(fd);
      return -1;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
  }

  int fd_;
  std::string path_;
  mutable std::once_flag direct_once_;
  mutable int direct_fd_ = -1;
};

class PosixFileSystem final : public FileSystem {
 public:
  // Checkpoints are the owner's alone (as MindSpore makes them): files and the
  // directories this interface creates are owner-only. A root made by create_dirs keeps
  // the usual mode, as users may share it.
  static constexpr mode_t kFileMode = 0600, kDirMode = 0700;
  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path,
                                                      const WriteOpenOptions& options) override {
    // A file opened as it is was made by us (a spare, an HDF5 layout): never through a
    // link planted in its place.
    const int kFlags = (options.mappable ? O_RDWR : O_WRONLY) | O_CREAT | (options.truncate ? O_TRUNC : O_NOFOLLOW) | O_CLOEXEC;
    if (options.direct_io && !in_memory_file_system(internal_base::dir_name(path))) {
      const int fd = ::open(path.c_str(), kFlags | O_DIRECT, kFileMode);
      if (fd >= 0) return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path, true, options));
      // EINVAL: the file system does not do O_DIRECT (some FUSE and network file
      // systems); fall back to buffered I/O. Other errors are reported below.
      if (errno != EINVAL) return errno_status("create", path, errno);
    }
    const int fd = ::open(path.c_str(), kFlags, kFileMode);
    if (fd < 0) return errno_status("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path, false, options));
  }
  Status evict_cached(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return errno_status("open", path, errno);
    // Clean pages only: the files verified were fsynced when committed.
    const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    return err == 0 ? Status() : errno_status("posix_fadvise", path, err);
  }
  Result<std::unique_ptr<ReadableFile>> open_readable(const std::string& path) override {
    // O_NONBLOCK: a FIFO planted in a checkpoint must not block the open; O_NOFOLLOW:
    // files of a checkpoint are never symlinks (nothing is read from outside it).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) return not_found("open '" + path + "': no such file");
      if (errno == ELOOP) return corruption("open '" + path + "': is a symbolic link");
      return errno_status("open", path, errno);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return errno_status("stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return corruption("open '" + path + "': not a regular file");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(fd, path));
  }
  Status create_dir(const std::string& path) override {
    if (::mkdir(path.c_str(), kDirMode) != 0) {
      if (errno == EEXIST) return already_exists("mkdir '" + path + "': exists");
      return errno_status("mkdir", path, errno);
    }
    return Status();
  }
  Status create_dirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return io_error("mkdir -p '" + path + "': " + ec.message());
    return Status();
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return io_error("rename '" + from + "' -> '" + to + "': " + std::strerror(errno));
    return Status();
  }
  Status rename_no_replace(const std::string& from, const std::string& to) override {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return Status();
    if (errno == EEXIST) return already_exists("rename '" + from + "' -> '" + to + "': target exists");
    // EINVAL / ENOSYS: the file system cannot do it atomically; check, then rename.
    if (errno == EINVAL || errno == ENOSYS) return FileSystem::rename_no_replace(from, to);
    return io_error("rename '" + from + "' -> '" + to + "': " + std::strerror(errno));
  }
  Status link_file(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0) {
      const int err = errno;
      // Another file system, or one without hard links: the caller copies instead.
      if (err == EXDEV || err == EPERM || err == ENOTSUP || err == EMLINK)
        return unsupported("link '" + from + "' -> '" + to + "': " + std::strerror(err));
      return errno_status("link", to, err);
    }
    return Status();
  }
  Status remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return errno_status("unlink", path, errno);
    return Status();
  }
  Status remove_all(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return io_error("rm -r '" + path + "': " + ec.message());
    return Status();
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    std::error_code ec;
    std::vector<DirEntry> out;
    std::filesystem::directory_iterator it(path, ec);
    if (ec) {
      if (ec == std::errc::no_such_file_or_directory) return not_found("list '" + path + "': no such directory");
      return io_error("list '" + path + "': " + ec.message());
    }
    // Non-throwing iteration: this runs inside collectives, where an exception on one
    // rank would leave the others waiting.
    for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
      if (ec) return io_error("list '" + path + "': " + ec.message());
      std::error_code ec2;
      // symlink_status: a symlink is never taken for a checkpoint directory.
      const bool is_dir = std::filesystem::is_directory(it->symlink_status(ec2));
      out.push_back(DirEntry{it->path().filename().string(), is_dir});
    }
    if (ec) return io_error("list '" + path + "': " + ec.message());
    return out;
  }
  bool exists(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
  }
  Result<uint64_t> file_size(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return not_found("stat '" + path + "': no such file");
      return errno_status("stat", path, errno);
    }
    return static_cast<uint64_t>(st.st_size);
  }
  Status sync_dir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("open directory", path, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return errno_status("fsync directory", path, err);
    return Status();
  }
  Status append_synced(const std::string& path, const std::string& data) override {
    // O_APPEND: concurrent appenders (two jobs in one root) never overwrite each other.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, kFileMode);
    if (fd < 0) return errno_status("open", path, errno);
    PosixWritableFile file(fd, path, false, WriteOpenOptions{});
    const char* p = data.data();
    std::size_t n = data.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno_status("append", path, errno);
      }
      if (w == 0) return io_error("append '" + path + "': no progress (device full?)");
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    DISTCKPT_RETURN_IF_ERROR(file.sync());
    return file.close();
  }
  Result<int64_t> modified_time_ns(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return not_found("stat '" + path + "': no such file");
      return errno_status("stat", path, errno);
    }
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  Status sync_file(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno_status("open", path, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return errno_status("fsync", path, err);
    return Status();
  }
};

}  // namespace

std::shared_ptr<FileSystem> posix_filesystem() {
  static const std::shared_ptr<FileSystem> fs = std::make_shared<PosixFileSystem>();
  return fs;
}

Result<std::string> read_whole_file(FileSystem& fs, const std::string& path, uint64_t max_bytes) {
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(path));
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file->size());
  if (size > max_bytes)
    return corruption("read '" + path + "': " + std::to_string(size) + " bytes is more than the " +
                      std::to_string(max_bytes) + " allowed for this file");
  std::string data(static_cast<std::size_t>(size), '\0');
  DISTCKPT_RETURN_IF_ERROR(file->read_at(data.data(), data.size(), 0));
  return data;
}

Status write_file_synced(FileSystem& fs, const std::string& path, const std::string& data) {
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(path));
  DISTCKPT_RETURN_IF_ERROR(file->write_at(data.data(), data.size(), 0));
  DISTCKPT_RETURN_IF_ERROR(file->sync());
  return file->close();
}

}  // namespace distckpt
