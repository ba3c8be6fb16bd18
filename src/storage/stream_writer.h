// The write side of the I/O engine: one data file written as a single sequential
// stream through aligned staging slabs, by a background writer thread.
//
// The caller appends the bytes of its chunks in file order (and the zeros of the gaps
// between them, kChunkAlignment in format/format.h); append() copies them into
// the current slab (the one copy of tensor bytes: with O_DIRECT the kernel copies
// nothing more, where buffered I/O would copy into the page cache), and full slabs go
// to the writer thread, which writes each with one large aligned pwrite. Each chunk's
// CRC32C is taken on the staged bytes while they are hot: by append() or by the writer
// thread before the pwrite (ChecksumOn, below). Copying the next
// slab overlaps writing the previous one; when every slab is queued, append() waits.
// finish() writes the padded tail, trims the padding, fsyncs, and returns the CRCs.
//
// Why: on the machines we measured, buffered writes of 1 GiB took 0.45-3.8 s (the page
// cache allocates fresh memory, which is slow on shared VMs), O_DIRECT from aligned
// buffers a steady 0.40-0.56 s, and a memcpy of 1 GiB 0.065 s. One write in flight per
// rank (overlapped with filling the next slab): 2 or 4 concurrent 8 MiB O_DIRECT writers
// per file gained nothing, with one process (1 GiB: 0.74-0.86 s with one writer,
// 0.84-0.94 s with 2 or 4) or four (4 x 256 MiB: 0.84-0.98 s for 1, 2 or 4).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "distckpt/filesystem.h"
#include "storage/staging.h"

namespace distckpt::internal_storage {

// A chunk's bytes in the stream: [begin, end).
struct ByteRange {
  uint64_t begin = 0, end = 0;
};

class StreamWriter {
 public:
  // `chunks` are where the chunks lie in the stream (ascending, not overlapping; the
  // last one ends the file, and bytes between them are gaps): the writer computes one
  // CRC32C per chunk, over its bytes only. `file` is written from
  // offset 0; `pool` must outlive the writer and serve only it while it runs.
  // With `checksum` false no CRC is computed (finish() returns zeros).
  // With `hold`, full slabs wait in the queue instead of being written while the caller
  // fills the next ones, until release_hold(), finish(), or a slab is needed and the pool
  // has none left (then writing starts, as without hold). An asynchronous save stages
  // with hold when its file is written through the page cache: there the write is a
  // second memory copy by the kernel, which would compete with the caller's copy for
  // the cores and the memory bandwidth while the training loop waits.
  //
  // Which thread computes the CRC32Cs. kWriterThread: the writer thread, before each
  // slab's pwrite, which keeps them off an async save's caller (it waits for the copy).
  // kAppend: append(), on each 256 KiB piece right after copying it (still in cache), so
  // that the writer thread only writes: with one write in flight, its CRC time is time the
  // disk idles (0.4-1.1 ms per 8 MiB slab between 4-5 ms writes, measured: 1 rank saving
  // 256 MiB to ext4 took 0.19 s against fio's 0.14-0.16 s).
  enum class ChecksumOn { kWriterThread, kAppend };
  StreamWriter(std::unique_ptr<WritableFile> file, StagingPool& pool, std::vector<ByteRange> chunks, std::string path,
               bool checksum = true, bool hold = false, ChecksumOn checksum_on = ChecksumOn::kWriterThread);
  // The same stream written through `view`, the file's own memory (map_for_write): no
  // slabs and no writer thread; append() copies into the file, finish() takes the CRCs
  // from it (on the thread that calls finish: an asynchronous save's background one).
  // `view` must stay valid as long as `file` is open (it is `file`'s).
  StreamWriter(std::unique_ptr<WritableFile> file, char* view, std::vector<ByteRange> chunks, std::string path,
               bool checksum = true);
  ~StreamWriter();  // joins the writer thread (after an abandoned stream, too)

  // Copies `n` bytes into the stream. Returns the writer's first error, if any.
  Status append(const void* data, std::size_t n);
  // Lets the writer thread write what is queued (and all that follows). Thread-safe.
  void release_hold();
  // Writes what is left, trims padding, fsyncs if asked, closes; returns the CRCs.
  Result<std::vector<uint32_t>> finish(bool fsync);

 private:
  struct Job {
    char* slab;
    uint64_t offset;  // stream offset of the slab's first byte
    std::size_t bytes;  // valid bytes in the slab
  };
  void run();
  void submit_current();
  // Extends the chunks' CRCs over `n` staged bytes at stream `offset` (in stream order;
  // gaps skipped), finishing each chunk that ends there. One thread at a time: the writer
  // thread, or append()'s with ChecksumOn::kAppend.
  void checksum_staged(const char* bytes, uint64_t offset, std::size_t n);
  Status writer_status();

  std::unique_ptr<WritableFile> file_;
  StagingPool* pool_;  // null when written through view_
  char* view_ = nullptr;
  std::vector<ByteRange> chunks_;
  uint64_t size() const { return chunks_.empty() ? 0 : chunks_.back().end; }
  std::string path_;

  char* current_ = nullptr;  // slab being filled by append()
  std::size_t fill_ = 0;
  uint64_t appended_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool closing_ = false;
  bool held_ = false;  // queued slabs wait (see the constructor)
  bool idle_ = true;
  Status error_;  // first write error (guarded by mu_)
  // CRC state: per-chunk CRCs, accumulated in stream order by the one thread that
  // checksum_on_ names (checksum_staged).
  std::vector<uint32_t> crcs_;
  std::size_t chunk_ = 0;
  uint32_t crc_state_ = 0;
  bool checksum_ = true;
  ChecksumOn checksum_on_ = ChecksumOn::kWriterThread;
  std::thread thread_;
};

}  // namespace distckpt::internal_storage
