// Sequential writers: the tensors' bytes arrive in order, tensor by tensor (each in
// row-major order, in pieces of any size), and the writer lays out its format's file.
// Used by gathered saves (pieces gathered from the ranks onto one writer) and by
// `distckpt convert` (pieces read from another checkpoint). One thread at a time.
// Each format's writer lives in its folder; the format table (format.h) opens them.
#pragma once

#include <memory>
#include <string>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"
#include "format/format.h"

namespace distckpt::internal_format {

class SequentialWriter {
 public:
  virtual ~SequentialWriter() = default;
  // Appends the next `n` bytes of tensor `tensor` (tensors in the order of the meta,
  // each exactly its size).
  virtual Status append(int tensor, const void* data, std::size_t n) = 0;
  // Writes what remains (info values, footer, header), fsyncs when asked, closes, and
  // returns the description of what was written (chunks with CRC32C for native).
  virtual Result<proto::Index> finish(bool fsync) = 0;
  uint64_t bytes_written() const { return bytes_written_; }

 protected:
  uint64_t bytes_written_ = 0;
};

// `meta`: metadata_of the checkpoint's index (tensors with dtype, shape and layout;
// step, epoch, info...). `path`: the entry to write (a single file, or the existing
// checkpoint directory of a directory format). kInvalidArgument for names the format
// cannot hold (check_writable), or for a cipher given to a format that cannot carry it.
Result<std::unique_ptr<SequentialWriter>> make_sequential_writer(Format format, FileSystem& fs,
                                                                 const std::string& path, const proto::Index& meta,
                                                                 const WriterOptions& options);

// ---- for the writers ----

// Buffered sequential output: small pieces (record headers) are coalesced, large ones
// go straight to the file. Computes the zlib CRC-32 of everything written.
class Output {
 public:
  explicit Output(std::unique_ptr<WritableFile> file) : file_(std::move(file)) {}
  Status write(const void* data, std::size_t n);
  Status write(const std::string& s) { return write(s.data(), s.size()); }
  Status flush();
  Status close(bool fsync);
  uint64_t position() const { return offset_ + buffer_.size(); }
  uint32_t crc32() const { return crc32_; }
  WritableFile& file() { return *file_; }

 private:
  static constexpr std::size_t kBuffer = 1 << 20;
  std::unique_ptr<WritableFile> file_;
  std::string buffer_;
  uint64_t offset_ = 0;
  uint32_t crc32_ = 0;
};

// Tracks the order of appends: tensors in order, each exactly its size.
class Progress {
 public:
  explicit Progress(const proto::Index& meta) : meta_(meta) {}
  // Checks that `n` more bytes of `tensor` are expected; returns the offset in it.
  Result<uint64_t> advance(int tensor, std::size_t n);
  Status check_complete() const;

 private:
  const proto::Index& meta_;
  int current_ = 0;
  uint64_t done_ = 0;
};

}  // namespace distckpt::internal_format
