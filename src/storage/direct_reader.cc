#include "storage/direct_reader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace distckpt::internal_storage {
namespace {

constexpr uint64_t kAlign = kDirectIoAlignment;
uint64_t align_down(uint64_t x) { return x / kAlign * kAlign; }
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// One read: [start, start + len) of a file, aligned, at most a slab.
struct Window {
  uint32_t file = 0;
  uint64_t start = 0, len = 0;
};

// The aligned extents of the ranges, merged where they share a page (the bytes between
// two ranges that do not are never read), cut into slabs.
std::vector<Window> plan_windows(std::span<const DirectRange> ranges, uint64_t slab) {
  std::vector<Window> spans;  // len holds the end until they are cut
  for (const DirectRange& r : ranges) {
    const uint64_t begin = align_down(r.offset), end = align_up(r.offset + r.n);
    if (!spans.empty() && spans.back().file == r.file && begin <= spans.back().len)
      spans.back().len = std::max(spans.back().len, end);
    else
      spans.push_back(Window{r.file, begin, end});
  }
  std::vector<Window> windows;
  for (const Window& s : spans)
    for (uint64_t at = s.start; at < s.len; at += slab) windows.push_back(Window{s.file, at, std::min(slab, s.len - at)});
  return windows;
}

// A window read into a slab: its first `got` bytes are the file's (fewer than its
// length only where the file ends).
struct Filled {
  char* slab = nullptr;
  uint64_t got = 0;
  bool direct = false;  // read with read_direct
  Status status;
};

// The reader thread and what it hands over. The pool's slab count bounds how far
// ahead it reads.
class Reader {
 public:
  Reader(const std::vector<Window>& windows, const OpenRangeFile& open_file, StagingPool& pool)
      : windows_(windows), open_file_(open_file), pool_(pool), thread_([this] { run(); }) {}
  // Stops the reads and gives back every slab (also when the copying side failed or
  // threw), then joins.
  ~Reader() {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    while (!done_ || !ready_.empty()) {
      cv_.wait(lock, [&] { return done_ || !ready_.empty(); });
      while (!ready_.empty()) {
        pool_.release(ready_.front().slab);
        ready_.pop_front();
      }
    }
    lock.unlock();
    thread_.join();
  }
  // The next window, in order.
  Filled next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty(); });
    Filled f = std::move(ready_.front());
    ready_.pop_front();
    return f;
  }

 private:
  void run() {
    const ReadableFile* file = nullptr;
    bool direct = false;
    for (std::size_t w = 0; w < windows_.size(); ++w) {
      const Window& win = windows_[w];
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
      }
      Filled out;
      try {
        if (file == nullptr || win.file != windows_[w - 1].file) {
          Result<const ReadableFile*> opened = open_file_(win.file);
          if (opened.ok()) {
            file = *opened;
            direct = file->can_read_direct();
          } else {
            out.status = opened.status();
          }
        }
        if (out.status.ok()) {
          out.slab = pool_.acquire();
          out.status = read(*file, win, out.slab, &out.got, &direct);
          out.direct = direct;
        }
      } catch (const std::exception& e) {
        out.status = internal_error("reading bytes " + std::to_string(win.start) + "-" +
                                    std::to_string(win.start + win.len) + " of the file: " + e.what());
      }
      const bool failed = !out.status.ok();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(out));
      }
      cv_.notify_all();
      if (failed) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }

  // Reads `win` into `slab`; a file system that refuses O_DIRECT (or its alignment)
  // turns `*direct` off and the window is read through the page cache instead.
  static Status read(const ReadableFile& file, const Window& win, char* slab, uint64_t* got, bool* direct) {
    if (*direct) {
      Result<std::size_t> n = file.read_direct(slab, win.len, win.start);
      if (n.ok()) {
        *got = *n;
        return Status();
      }
      if (n.status().code() != StatusCode::kUnsupported) return n.status();
      *direct = false;
    }
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file.size());
    *got = size > win.start ? std::min(win.len, size - win.start) : 0;
    return file.read_at(slab, *got, win.start);
  }

  const std::vector<Window>& windows_;
  const OpenRangeFile& open_file_;
  StagingPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Filled> ready_;
  bool stop_ = false, done_ = false;
  std::thread thread_;  // last: starts once the members it uses are made
};

}  // namespace

Status read_ranges(std::span<const DirectRange> ranges, const OpenRangeFile& open_file, const CopiedPiece& on_copied,
                   const NameRange& name_range, StagingPool& pool, uint64_t* direct_bytes) {
  if (ranges.empty()) return Status();
  const std::vector<Window> windows = plan_windows(ranges, pool.slab_bytes());
  Reader reader(windows, open_file, pool);
  constexpr uint64_t kPiece = 256 << 10;  // copied, then handed over while in cache
  std::size_t r = 0;                      // the first range not wholly copied
  for (const Window& win : windows) {
    Filled filled = reader.next();
    // The slab goes back to the pool whatever happens below.
    struct Give {
      StagingPool& pool;
      char* slab;
      ~Give() {
        if (slab != nullptr) pool.release(slab);
      }
    } give{pool, filled.slab};
    // The failed window holds bytes of range r (the first not wholly copied).
    if (!filled.status.ok()) return filled.status.with_context(name_range(std::min(r, ranges.size() - 1)));
    const uint64_t win_end = win.start + win.len, have_end = win.start + filled.got;
    for (; r < ranges.size() && ranges[r].file == win.file && ranges[r].offset < win_end; ++r) {
      const DirectRange& range = ranges[r];
      const uint64_t begin = std::max(range.offset, win.start), end = std::min(range.offset + range.n, win_end);
      if (filled.direct && direct_bytes != nullptr && end > begin && end <= have_end) *direct_bytes += end - begin;
      if (end > have_end)
        return corruption(name_range(r) + ": the file ends at byte " + std::to_string(have_end) + ", before byte " +
                          std::to_string(range.offset + range.n) + " (truncated)");
      for (uint64_t at = begin; at < end; at += kPiece) {
        const uint64_t n = std::min(kPiece, end - at);
        char* dst = range.dst + (at - range.offset);
        std::memcpy(dst, filled.slab + (at - win.start), n);
        DISTCKPT_RETURN_IF_ERROR(on_copied(r, at - range.offset, dst, n));
      }
      if (end < range.offset + range.n) break;  // it goes on in the next window
    }
  }
  return Status();
}

}  // namespace distckpt::internal_storage
