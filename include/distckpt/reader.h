/// Reading one checkpoint in one process, without MPI: any format (a native directory, a
/// per-rank .ckpt set, a .ckpt, safetensors or HDF5 file), whole tensors or a box of one,
/// checked as load() checks them. Python's distckpt.open is this reader.
///
///   auto reader = distckpt::Reader::open("/ckpt");           // a root: its newest checkpoint
///   if (!reader.ok()) { /* reader.status().to_string() */ }
///   std::vector<float> w(16 * 8);
///   distckpt::Status st = reader->read("mlp.fc1.weight", w.data(), w.size() * sizeof(float));
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/inspect.h"
#include "distckpt/layout.h"
#include "distckpt/status.h"

namespace distckpt {

struct ReaderOptions {
  std::shared_ptr<FileSystem> fs;                    ///< null: POSIX
  std::shared_ptr<const EncryptionKey> key = nullptr;  ///< an encrypted checkpoint's
  /// A box that covers part of a stored chunk: true reads the chunk whole so that its
  /// CRC32C is checked; false reads only the box's bytes (unchecked, as a resharding
  /// load reads them). Chunks read whole are checked either way.
  bool check_partial_chunks = true;
};

/// Not thread-safe: one thread at a time per Reader (separate Readers of one checkpoint
/// may be used from separate threads). Not collective: no MPI is used or needed.
class Reader {
 public:
  /// Resolves `path` (a root gives its newest checkpoint) and reads its description.
  /// kNotFound (nothing there), kCorruption (a damaged description), kUnsupported (a
  /// newer format version, data nothing checks that ReaderOptions cannot allow: see
  /// unchecked_reason), kAuthFailed (encrypted: no key or the wrong one), kIoError.
  static Result<Reader> open(const std::string& path, const ReaderOptions& options = {});
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();

  /// The checkpoint's description, as `distckpt inspect` shows it (tensors in stored
  /// order, their chunks and files, info values, step and epoch). Owned by the Reader.
  const CheckpointInfo& info() const;
  /// The stored tensor `name`'s description; nullptr when there is none.
  const TensorInfo* tensor(const std::string& name) const;

  /// Reads tensor `name` whole, row-major, into `dst` (the caller's memory, exactly
  /// `dst_bytes` = elements x dtype size). kNotFound for an unknown name, kInvalidArgument
  /// for a buffer of another size, kCorruption / kAuthFailed naming the file for data
  /// that fails its check, kIoError.
  Status read(const std::string& name, void* dst, std::size_t dst_bytes);
  /// Reads `region` (a box inside the tensor) of tensor `name` into `dst` (row-major, the
  /// region's bytes). As above; kInvalidArgument for a region outside the tensor.
  Status read(const std::string& name, const Box& region, void* dst, std::size_t dst_bytes);

  /// Why reads are not checked, or "" when every chunk read whole is: a .ckpt whose only
  /// checksum is MindSpore's whole-file footer (check_files() then checks it), or data
  /// that records no checksums.
  std::string unchecked_reason() const;
  /// Reads each data file whole once and checks its whole-file CRC-32 (a .ckpt's footer);
  /// kCorruption naming the file on a mismatch. A second call reads nothing.
  Status check_files();

 private:
  Reader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distckpt
