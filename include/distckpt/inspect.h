/// Reading checkpoints without a job: describe, verify, list a root and find its newest.
/// Local (one process, no communicator) and thread-safe.
///
/// Every call takes the file system and, for encrypted checkpoints, the key in its
/// options struct (InspectOptions), as every options struct of distckpt does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/dtype.h"
#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

struct InspectOptions {
  std::shared_ptr<FileSystem> fs = nullptr;  ///< null: POSIX
  /// The key of an encrypted checkpoint (describing its tensors, verifying its chunks).
  /// With a key, a checkpoint that is not encrypted is refused (kAuthFailed): a plain
  /// checkpoint in an encrypted one's place is a downgrade.
  std::shared_ptr<const EncryptionKey> key = nullptr;
};

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

/// kCommitted: a checkpoint. kInFlight: a save in progress or abandoned (.tmp-*).
/// kBroken: damaged (empty, truncated, a bad index). kForeign: a file with a checkpoint
/// format's extension whose contents are not that format (a zip, a pickle, text): never
/// resumed from, retained or removed.
/// kRetired: a retired checkpoint that still holds data files other checkpoints
/// reference (incremental saves); not loadable, freed once nothing references them.
enum class EntryState { kCommitted, kInFlight, kBroken, kForeign, kRetired };
struct CheckpointEntry {
  std::string name;
  EntryState state = EntryState::kBroken;
  /// Why broken, in flight, foreign or retired; for a committed one, a warning or "" (its
  /// data carries no checksums: "unchecked: structure only: ..."; a per-rank set without
  /// a MindSpore strategy file: "no MindSpore strategy: tensor 'x': ...").
  std::string detail;
  int64_t step = -1, epoch = -1;
  /// Data bytes in the entry's own files (committed and retired entries). An incremental
  /// checkpoint's unchanged chunks are in files of earlier checkpoints: their sizes are in
  /// referenced_bytes, those checkpoints' names in `references`.
  uint64_t bytes = 0;
  uint64_t referenced_bytes = 0;
  std::vector<std::string> references;
  Format format = Format::kNative;
  bool per_rank_files = false;  ///< a per-rank .ckpt set, listed as one checkpoint
  int64_t created_unix_ms = 0;
  uint64_t commit_seq = 0;       ///< see resolve_checkpoint
  bool advances_latest = false;  ///< saved with update_latest
  /// A .ckpt encrypted whole, listed without its key: its step, epoch and commit order are
  /// inside it (unknown here); resolve_checkpoint takes it only when `latest` names it.
  bool sealed = false;
};
struct RootListing {
  std::vector<CheckpointEntry> entries;  ///< committed ordered by (step, created), others after
  std::string latest;                    ///< target of <root>/latest, empty when none/invalid
};
/// Lists the entries under `root`: committed checkpoints, in-flight (.tmp-*) and broken
/// ones (no valid description, with the reason in `detail`), each reported as such;
/// reads every index (no key needed). kNotFound if `root` does not exist; kIoError if
/// it cannot be listed. Damaged checkpoints are reported as entries, not as errors.
Result<RootListing> list_checkpoints(const std::string& root, const InspectOptions& options = {});

/// If `path` is a checkpoint (a directory with an index, or a single file), returns it.
/// If it is a root, returns the newest committed checkpoint among those saved with
/// update_latest (all committed ones if none was): the highest commit sequence number,
/// ties going to the `latest` pointer's target, then to the later commit time. The
/// sequence number (claimed at save time above every committed checkpoint's, `latest`'s
/// target's and every number handed out before) makes this independent
/// of clocks, and a crash between the rename and the pointer update (which leaves
/// `latest` one behind) still resumes from the newer checkpoint. kNotFound when there is
/// none (naming damaged directories, if any); kCorruption when `latest` names a damaged
/// checkpoint, so that a job never falls back to an older one silently; I/O errors of
/// the listing.
Result<std::string> resolve_checkpoint(const std::string& path, const InspectOptions& options = {});

/// Removes the committed checkpoint `name` of `root` the way the manager's retention does
/// (src/catalog/references.h): it stops being listed at once; its files go, except those
/// later checkpoints reference (incremental saves), which stay, listed as "retired", until
/// nothing references them. Never `rm -rf` a checkpoint directory of a root with
/// incremental saves: later checkpoints may read its files. Local, one process, any
/// thread. kNotFound if there is no such committed checkpoint; kInvalidArgument for a
/// name that cannot be a checkpoint's; errors of the file system.
Status remove_checkpoint(const std::string& root, const std::string& name, const InspectOptions& options = {});

}  // namespace distckpt
