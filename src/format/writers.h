// Sequential writers of single-file formats: the tensors' bytes arrive in order,
// tensor by tensor (each in row-major order, in pieces of any size), and the writer
// lays out the file. Used by integrated save (pieces gathered from the ranks) and by
// `distckpt convert` (pieces read from another checkpoint). One thread at a time.
#pragma once

#include <memory>
#include <string>

#include "distckpt/checkpoint.h"
#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

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
// step, epoch, info...). `path`: the file to create (for kNative, the data file inside
// the checkpoint directory). `cipher` (kNative and kCkpt; borrowed, must outlive the
// writer): native: each tensor becomes one encrypted chunk; ckpt: each box of each
// record (ms_ckpt.h). kInvalidArgument for names the
// format cannot hold; encryption_refused(format) for a cipher with another format.
Result<std::unique_ptr<SequentialWriter>> make_sequential_writer(Format format, FileSystem& fs,
                                                                 const std::string& path, const proto::Index& meta,
                                                                 bool ckpt_crc_footer,
                                                                 const internal_transform::CheckpointCipher* cipher = nullptr);

// OK for kNative and kCkpt; otherwise the error for asking `format` to be encrypted:
// kInvalidArgument for safetensors and HDF5 (no place for nonces and tags).
Status encryption_refused(Format format);

// Checks, before any writing, that `meta` can be stored in `format` (names, info keys).
Status check_writable(Format format, const proto::Index& meta);

}  // namespace distckpt::internal_format
