/// Reading checkpoints without a job: describe and verify (listing a root and finding its
/// newest: catalog.h, included here). Local (one process, no communicator) and
/// thread-safe.
///
/// Every call takes the file system and, for encrypted checkpoints, the key in its
/// options struct (InspectOptions), as every options struct of distckpt does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/catalog.h"
#include "distckpt/dtype.h"
#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

struct ChunkInfo {
  Box box;
  std::string file;        ///< relative to the checkpoint directory
  uint64_t byte_offset = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;
  int writer_rank = -1;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  Shape dev_mat;       ///< empty for explicit layouts
  Shape tensor_map;
  std::vector<int> ranks;  ///< the group at save time (group index -> global rank)
  std::vector<ChunkInfo> chunks;
};

struct FileInfo {
  std::string name;
  uint64_t size = 0;
  /// A reference (incremental saves): the file is <root>/<checkpoint>/<name>, a data file
  /// of that earlier checkpoint. Empty: this checkpoint's own file.
  std::string checkpoint;
};

struct CheckpointInfo {
  std::string path;
  std::string name;
  uint32_t format_version = 0;
  Format format = Format::kNative;
  /// A per-rank .ckpt set (SaveSettings::integrated = false): `format` is kNative (its
  /// manifest is a native index) and `files` are rank_<r>/<name>.ckpt.
  bool per_rank_files = false;
  int64_t step = -1;
  int64_t epoch = -1;
  int world_size = 0;
  int64_t created_unix_ms = 0;
  uint64_t commit_seq = 0;
  bool advances_latest = false;
  std::string writer_version;  ///< the distckpt version that wrote it; "" when not recorded
  Checksum checksum = Checksum::kCrc32c;
  EncryptionMode encryption_mode = EncryptionMode::kNone;
  /// "none", or the algorithm with its key size ("AES-256-GCM", "AES-256-CBC-HMAC-SHA256",
  /// ...). A .ckpt encrypted whole in MindSpore's framing: "AES-256-GCM (MindSpore framing)",
  /// "AES-CBC (MindSpore framing)" while its key size is unknown (read without the key).
  std::string encryption = "none";
  /// Encrypted and read without its key: `tensors` is empty (the table is sealed). A
  /// .ckpt encrypted whole then also hides step, epoch and info values (-1 and empty),
  /// and `files` gives its size on disk.
  bool tensors_sealed = false;
  std::vector<TensorInfo> tensors;
  std::vector<FileInfo> files;
  std::map<std::string, InfoValue> info;
  uint64_t data_bytes() const;  ///< sum of file sizes
};

/// Reads and validates the description of the checkpoint at `path` (a directory or a
/// single file). kNotFound without one; kCorruption / kUnsupported for a damaged or
/// newer one; kIoError. An encrypted checkpoint read without `key` describes everything
/// but its tensors (tensors_sealed); with a key, kAuthFailed if it is not the right one,
/// or if the checkpoint is not encrypted.
Result<CheckpointInfo> read_checkpoint_info(const std::string& path, const InspectOptions& options = {});

struct VerifyOptions : InspectOptions {
  /// Drop each file from the operating system's page cache before reading it, so that
  /// every byte checked comes from storage, not from memory a writer left behind
  /// (FileSystem::evict_cached; best effort: a file system without it is read as usual).
  /// With `key`, every chunk is authenticated too (without it an encrypted checkpoint is
  /// kAuthFailed: the key is needed).
  bool deep = false;
  /// A checkpoint that records no checksums: as LoadOptions::allow_unchecked (unset: a
  /// .ckpt or an HDF5 file passes with a warning in the report, the others are
  /// kUnsupported; true: all pass with the warning; false: all are refused).
  std::optional<bool> allow_unchecked;
};
struct VerifyReport {
  uint64_t tensors = 0, chunks = 0, files = 0, bytes_checked = 0;
  bool deep = false;    ///< every file was evicted from the cache before being read
  /// The checkpoint records checksums, per chunk (CRC32C) or per file (a .ckpt's CRC-32
  /// footer); false: sizes and structure only.
  bool checksums = true;
  bool authenticated = false;  ///< encrypted, and every chunk's tag was checked with the key
  /// What was checked, in words: "sizes and every chunk's CRC32C", "sizes and the file's
  /// CRC-32 footer", "sizes, every tensor's CRC32C and the structure's CRC32C footer" (an
  /// HDF5 file distckpt wrote), "structure only: no checksums recorded", ...
  std::string checked;
  /// Data nothing checks that passed all the same (a .ckpt MindSpore wrote without its
  /// footer, an HDF5 file from h5py, allow_unchecked), in one line; "" when every byte was
  /// checked.
  std::string warning;
};
/// Reads every chunk and checks the index (framing, CRC32C, every number), file sizes,
/// bounds and every chunk's CRC32C (single files: their whole-file CRC-32 and per-tensor
/// CRC32C where recorded, and an HDF5 file's footer over its structure; a per-rank set:
/// each file's CRC-32, its strategy file's included). kCorruption naming the file and tensor on the first failure;
/// kNotFound for a missing file; kIoError.
Result<VerifyReport> verify_checkpoint(const std::string& path, const VerifyOptions& options = {});

}  // namespace distckpt
