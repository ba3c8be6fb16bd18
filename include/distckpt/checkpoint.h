// Sharded save and load of a StateDict, and read-only access to saved checkpoints.
//
// A checkpoint is a directory <root>/<name>/ holding data-NNNNN.bin files (one per
// writing rank) and index.pb (the protobuf index, written last by rank 0). It exists
// if and only if that final-named directory exists with a valid index: saves go to
// <root>/<name>.tmp-<id>/ and are renamed only after every rank succeeded (see
// src/catalog/commit.cc for the protocol, step by step).
//
// Collective functions (save, load) must be called by every rank of the Comm, in the
// same order, with state dicts describing the same tensors. They return the same
// Status on every rank: if one rank fails, all fail with that rank's error, nothing
// new becomes visible, and no earlier checkpoint is touched. They are called from
// the thread that owns the Comm. Local functions (list, read, verify) are
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/comm.h"
#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

// The newest version of the on-disk index this build writes (2: an encrypted checkpoint,
// which builds that know only version 1 must refuse rather than read as empty; plain
// checkpoints are still written as 1). Newer versions are refused on read.
inline constexpr uint32_t kIndexFormatVersion = 2;

// What a save writes.
//   kNative: a checkpoint directory (data files + index.pb).
//   kCkpt: one MindSpore-compatible protobuf .ckpt file (MindSpore's load_checkpoint
//     reads it; records over 512 MiB split as MindSpore does; optional CRC-32 footer).
//   kSafetensors: one .safetensors file (standard header, data 8-byte aligned).
//   kHdf5: one .h5 file written with parallel HDF5 (a dataset per tensor).
// ckpt and safetensors files are written by one rank from tensors reconstructed region
// by region (gather_region); HDF5 files by every rank, each unique slice as a
// hyperslab. All are loaded by load() into any layout, each rank reading its slice.
enum class Format { kNative, kCkpt, kSafetensors, kHdf5 };
std::string_view format_name(Format format);  // "native", "ckpt", "safetensors", "hdf5"
// Inverse of format_name (also accepts "h5"); nullopt for anything else.
std::optional<Format> format_from_name(std::string_view name);

struct SaveOptions {
  // Directory name under root. Must be non-empty, without '/', not "latest", not
  // containing ".tmp-". Saving onto an existing checkpoint fails with kAlreadyExists.
  std::string name;
  int64_t step = -1;   // recorded in the index; -1 = unknown
  int64_t epoch = -1;  // recorded in the index; -1 = unknown
  // Write each unique slice once (replicas removed, writing balanced by bytes).
  // When false, every rank writes every box it holds (for debugging / parity).
  bool remove_redundancy = true;
  // Move <root>/latest to this checkpoint after commit. false makes a side snapshot:
  // listed and loadable by path, but never picked by resolve_checkpoint / resume.
  bool update_latest = true;
  bool fsync = true;          // fsync files and directories (commit protocol steps 2-3)
  // CRC32C of every chunk, computed while the bytes are hot and checked by load and
  // verify. Off only to measure its cost (ckpt_bench --no-checksum): the index is
  // checksummed either way, the data then is not (transforms.checksum = "none").
  // Sharded native saves only; integrated saves and single files keep their checksums.
  bool checksum = true;
  // Write data files with O_DIRECT through aligned staging buffers where the file
  // system allows it (buffered I/O otherwise). Faster and steadier on the machines we
  // measured: see src/storage/stream_writer.h.
  bool direct_io = true;
  std::shared_ptr<FileSystem> fs;  // null: POSIX
  // Encrypt the checkpoint (encryption.h): every chunk's bytes, and the index's tensor
  // table. Every rank passes the same mode and key (compared by fingerprint, never sent;
  // kInvalidArgument otherwise). Native checkpoints (sharded, integrated, asynchronous)
  // and .ckpt files (whose tensor names, dtypes, shapes and layouts stay readable: the
  // records name them); safetensors and HDF5 cannot carry it and refuse
  // (kInvalidArgument).
  Encryption encryption;

  // ---- single-file (integrated) saves ----
  Format format = Format::kNative;
  // kNative only: write full tensors (reconstructed with gather_region) into one data
  // file written by `writer_rank`, instead of each rank writing its unique slices.
  // ckpt and safetensors are always integrated; HDF5 never needs the gather.
  bool integrated = false;
  // Rank that writes an integrated file (ckpt, safetensors, native + integrated).
  int writer_rank = 0;
  // Bytes of a tensor reconstructed at a time: the writer holds two such regions (one
  // being written while the next is gathered) plus the staging of pieces that are not
  // contiguous in a region, so its memory beyond its own state is at most 3x this. A
  // region is whole rows of dim 0 (one row if a row is larger).
  uint64_t gather_bytes = uint64_t{64} << 20;
  // kCkpt: append MindSpore's CRC-32 footer ("crc_num"), checked on load and verify.
  // MindSpore >= 2.1 reads it; turn it off for older MindSpore readers.
  bool ckpt_crc_footer = true;
};

struct SaveResult {
  std::string path;             // <root>/<name> (single files: with the format's extension)
  uint64_t bytes_unique = 0;    // size of the state once (sum of global tensor sizes)
  uint64_t bytes_written = 0;   // data bytes written by all ranks (excludes the index)
  uint64_t rank_bytes_written = 0;  // by this rank
  uint64_t index_bytes = 0;
  double plan_s = 0, write_s = 0, commit_s = 0;  // wall time of each phase on this rank
  // Non-fatal problem after the commit (e.g. `latest` could not be moved); empty if none.
  std::string warning;
};

// Collective. Saves `state` under `root` (created if missing). Buffers in `state` are
// only read, during the call; nothing is kept after it returns. Info values are taken
// from rank 0's state dict. Errors, identical on all ranks: kInvalidArgument (bad name,
// layouts naming ranks outside the communicator, state dicts that disagree across
// ranks on names, order, dtypes, shapes or layouts, boxes that do not tile a tensor; an
// explicit layout must be built identically on every rank, every member's boxes in the
// same order, because rank 0 plans every rank's writes from its own copy),
// kAlreadyExists (the name is taken), kIoError and any other error of the file system,
// kInternal (a bug). On error nothing new is visible under `root` and existing
// checkpoints are untouched; a leftover <name>.tmp-* directory can remain only if the
// cleanup itself failed. Non-fatal problems after the commit are in SaveResult::warning.
Result<SaveResult> save(Comm& comm, const StateDict& state, const std::string& root,
                        const SaveOptions& options);

struct LoadOptions {
  // true: every tensor of `state` must be in the checkpoint (else kMismatch naming it).
  // false: missing tensors are skipped and reported in LoadResult.
  bool strict = true;
  // Load only these names (all of `state` when empty). Every name must be in `state`.
  std::vector<std::string> only;
  std::shared_ptr<FileSystem> fs;  // null: POSIX
  // Who reads a box that several ranks (replicas) need. kShared: one member of the
  // replica group reads and checks it, then sends it to the others over the
  // communicator (bytes read from storage / replica count). kEach: every rank reads for
  // itself. kAuto (default): kShared when the communicator spans several nodes, kEach
  // on one node, where the page cache already serves the second reader and the
  // transfer costs as much as the read (README "Benchmark" has the measurements).
  // kShared falls back to kEach when ranks do not load the same tensors in order.
  enum class ReplicaReads { kAuto, kShared, kEach };
  ReplicaReads replica_reads = ReplicaReads::kAuto;
  // A stored chunk only partly needed (a load into another layout): false (default)
  // reads only the byte ranges needed (read amplification 1.0), which its CRC32C, taken
  // over the whole chunk, cannot check; true reads the whole chunk and checks it. Chunks
  // needed whole are always checked. verify_checkpoint() checks every byte.
  // (Encrypted chunks are always read whole: a part of one cannot be authenticated.)
  bool check_partial_chunks = false;
  // The key of an encrypted checkpoint (kAuthFailed without it, or with a wrong one).
  std::shared_ptr<const EncryptionKey> key;
};

struct LoadResult {
  int64_t step = -1;
  int64_t epoch = -1;
  std::map<std::string, InfoValue> info;
  std::vector<std::string> loaded;
  std::vector<std::string> missing_in_checkpoint;    // asked for, not in the checkpoint
  std::vector<std::string> unexpected_in_checkpoint;  // in the checkpoint, not asked for
  uint64_t rank_bytes_read = 0;  // data bytes this rank read
  uint64_t bytes_read = 0;       // summed over ranks
  // Bytes of the boxes this rank read for (its own, and with shared replica reads those
  // it sends), summed over ranks: bytes_read / bytes_needed is the read amplification
  // (1.0 unless check_partial_chunks, or runs under 4 KiB read by data sieving).
  uint64_t rank_bytes_needed = 0;
  uint64_t bytes_needed = 0;
  // Where this rank's time went: reading (with checksums and copies into the buffers),
  // and sending/receiving boxes shared between replicas (shared replica reads).
  double read_s = 0, exchange_s = 0;
  double load_s = 0;
};

// Collective. Fills the buffers of `state` from the checkpoint directory `path` (a
// root is resolved to its newest committed checkpoint, see resolve_checkpoint). Each
// rank reads only the bytes of its boxes (any layout: stored chunks are intersected with
// the boxes), checks the CRC32C of every chunk it reads whole (partly needed chunks: see
// LoadOptions::check_partial_chunks), and copies them into its buffers. A global shape
// differing only by trailing dims of size 1 is accepted. Thread: the communicator's.
// Memory: `state`'s buffers are borrowed and written. Errors, identical on all ranks: kNotFound (no
// checkpoint, missing data file), kCorruption (bad index, truncated file, checksum,
// chunks not covering a needed box), kMismatch (dtype, global shape, missing tensor when
// strict), kUnsupported (newer index version), kInvalidArgument (a name in `only` that is
// not in `state`, a state dict built for another rank), kAuthFailed (encrypted: no key,
// a wrong key, a modified, moved or swapped chunk or index, naming it; or a key given
// for a checkpoint that is not encrypted), kIoError. All metadata checks (names, dtypes,
// shapes, coverage, files and their sizes, the encrypted index's authentication) pass on
// every rank before any buffer is written, so those errors leave `state` untouched;
// only a checksum or chunk authentication error found while reading can leave buffers
// partly overwritten (a chunk that fails authentication is zeroed, not left as read).
Result<LoadResult> load(Comm& comm, StateDict& state, const std::string& path,
                        const LoadOptions& options);

// ---- conversion (local: one process, no communicator) ----

struct ConvertOptions {
  bool fsync = true;
  bool ckpt_crc_footer = true;  // as SaveOptions::ckpt_crc_footer
  // Bytes of a tensor held at a time (whole rows of dim 0; a native source reads at
  // least one stored chunk at a time, so its largest chunk bounds memory too).
  uint64_t region_bytes = uint64_t{64} << 20;
  // Called after each region with bytes done, bytes in total and the tensor's name.
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
  // Convert only the tensors whose names equal or start with one of these (empty: all).
  // Each entry must select at least one tensor (kInvalidArgument otherwise: a typo
  // would silently drop what it meant to keep).
  std::vector<std::string> only;
  std::shared_ptr<FileSystem> fs;  // null: POSIX
  std::shared_ptr<const EncryptionKey> key;  // the source's, when it is encrypted
  // Encrypt the destination (native or ckpt; a new salt, so new keys and nonces).
  // Other formats refuse (kInvalidArgument).
  Encryption encryption;
};

struct ConvertResult {
  std::string path;         // what was written (single files: with their extension)
  uint64_t bytes = 0;       // tensor bytes converted
  uint64_t bytes_read = 0;  // bytes read from the source
};

// Local, thread-safe for distinct destinations. Streams the checkpoint `src` (any
// format; a root gives its newest) into a new checkpoint `dst` of format `to`: tensors
// with their names, dtypes, shapes and layouts at save, step, epoch and info values.
// Memory is bounded by ConvertOptions::region_bytes. The result is committed like a
// save (written as <dst>.tmp-<id>, fsynced, renamed without replacing) but never moves
// a `latest` pointer. Errors: those of read_checkpoint_info and load for the source
// (kCorruption on a checksum mismatch), kAlreadyExists when `dst` exists,
// kInvalidArgument for names `to` cannot hold, kIoError.
Result<ConvertResult> convert_checkpoint(const std::string& src, const std::string& dst, Format to,
                                         const ConvertOptions& options = {});

// ---- publishing (local: one process, no communicator) ----

struct PublishOptions {
  // A single-file format: kSafetensors (default), kCkpt or kHdf5.
  Format format = Format::kSafetensors;
  // The tensors to publish, by name or name prefix (MMEngine's published_keys, e.g.
  // {"model."} to leave the optimizer out); empty: all. Each must select a tensor.
  std::vector<std::string> only;
  std::string directory;  // where the file goes; "" : beside the source checkpoint
  bool fsync = true;
  bool ckpt_crc_footer = true;
  uint64_t region_bytes = uint64_t{64} << 20;  // as ConvertOptions::region_bytes
  std::shared_ptr<FileSystem> fs;              // null: POSIX
  // The source's key, when it is encrypted. The published file is not encrypted: it is
  // meant to be shared (publish to native or ckpt with convert_checkpoint to keep it so).
  std::shared_ptr<const EncryptionKey> key;
};

struct PublishResult {
  std::string path;    // <directory>/<source name>-<first 8 hex digits of sha256><ext>
  std::string sha256;  // of the whole file, 64 lowercase hex digits
  uint64_t file_bytes = 0;
  std::vector<std::string> tensors;  // published
  std::vector<std::string> dropped;  // in the source, left out by `only`
  bool already_published = false;    // an identical file was there already
};

// Local, thread-safe for distinct sources. Exports the checkpoint `src` (any format; a
// root gives its newest), or the tensors `only` selects, as one integrated file whose
// name carries the first 8 hex digits of its SHA-256 (MMEngine's published
// checkpoints). The file is reproducible: no clock or directory state is stored in
// it, so publishing the same checkpoint (same name, tensors, layouts at save, step,
// epoch and info) twice gives the same bytes and name (the second call, or a
// concurrent one, finds the file and returns already_published). It is committed like
// a save (temporary name, fsync, rename without replacing) and never moves `latest`;
// resume never picks it. Memory: one region of region_bytes. Errors: those of
// convert_checkpoint (a damaged source is refused before anything is written),
// kInvalidArgument for a format that is not a single file or an `only` entry that
// selects nothing, kAlreadyExists when a different file has the same name.
Result<PublishResult> publish_checkpoint(const std::string& src, const PublishOptions& options = {});

// ---- read-only access (local, thread-safe) ----

struct ChunkInfo {
  Box box;
  std::string file;        // relative to the checkpoint directory
  uint64_t byte_offset = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;
  int writer_rank = -1;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  Shape dev_mat;       // empty for explicit layouts
  Shape tensor_map;
  std::vector<int> ranks;  // the group at save time (group index -> global rank)
  std::vector<ChunkInfo> chunks;
};

struct FileInfo {
  std::string name;
  uint64_t size = 0;
};

struct CheckpointInfo {
  std::string path;
  std::string name;
  uint32_t format_version = 0;
  std::string format = "native";
  int64_t step = -1;
  int64_t epoch = -1;
  int world_size = 0;
  int64_t created_unix_ms = 0;
  uint64_t commit_seq = 0;
  bool advances_latest = false;
  std::string checksum = "crc32c";
  // "none", or the algorithm ("AES-256-GCM", "AES-256-CBC-HMAC-SHA256", ...).
  std::string encryption = "none";
  std::string encryption_mode = "none";  // its EncryptionMode's name ("AES-GCM", ...)
  // Encrypted and read without its key: `tensors` is empty (the table is sealed).
  bool tensors_sealed = false;
  std::vector<TensorInfo> tensors;
  std::vector<FileInfo> files;
  std::map<std::string, InfoValue> info;
  uint64_t data_bytes() const;  // sum of file sizes
};

// Reads and validates the index of the checkpoint directory `path`. kNotFound without
// an index; kCorruption / kUnsupported for a damaged or newer one; kIoError. An
// encrypted checkpoint read without `key` describes everything but its tensors
// (tensors_sealed); with a key, kAuthFailed if it is not the right one, or if the
// checkpoint is not encrypted (a plain checkpoint in an encrypted one's place).
Result<CheckpointInfo> read_checkpoint_info(const std::string& path,
                                            std::shared_ptr<FileSystem> fs = nullptr);
Result<CheckpointInfo> read_checkpoint_info(const std::string& path, std::shared_ptr<FileSystem> fs,
                                            std::shared_ptr<const EncryptionKey> key);

struct VerifyOptions {
  // Drop each file from the operating system's page cache before reading it, so that
  // every byte checked comes from storage, not from memory a writer left behind
  // (FileSystem::evict_cached; best effort: a file system without it is read as usual).
  bool deep = false;
  // The key of an encrypted checkpoint: every chunk is then authenticated too. Without
  // it, kAuthFailed (the key is needed); with it, a checkpoint that is not encrypted is
  // refused (kAuthFailed).
  std::shared_ptr<const EncryptionKey> key;
};
struct VerifyReport {
  uint64_t tensors = 0, chunks = 0, files = 0, bytes_checked = 0;
  bool deep = false;    // every file was evicted from the cache before being read
  bool checksums = true;  // the checkpoint records checksums (false: sizes and structure only)
  bool authenticated = false;  // encrypted, and every chunk's tag was checked with the key
};
// Local (no MPI), any thread. Reads every chunk and checks the index (framing, CRC32C,
// every number), file sizes, bounds and every chunk's CRC32C (single files: their
// whole-file CRC-32 and per-tensor CRC32C where recorded). kCorruption naming the file
// and tensor on the first failure; kNotFound for a missing file; kIoError.
Result<VerifyReport> verify_checkpoint(const std::string& path,
                                       std::shared_ptr<FileSystem> fs = nullptr);
Result<VerifyReport> verify_checkpoint(const std::string& path, const VerifyOptions& options,
                                       std::shared_ptr<FileSystem> fs = nullptr);

enum class EntryState { kCommitted, kInFlight, kBroken };
struct CheckpointEntry {
  std::string name;
  EntryState state = EntryState::kBroken;
  std::string detail;  // why broken
  int64_t step = -1, epoch = -1;
  uint64_t bytes = 0;
  std::string format;
  int64_t created_unix_ms = 0;
  uint64_t commit_seq = 0;       // see resolve_checkpoint
  bool advances_latest = false;  // saved with update_latest
};
struct RootListing {
  std::vector<CheckpointEntry> entries;  // committed ordered by (step, created), others after
  std::string latest;                    // target of <root>/latest, empty when none/invalid
};
// Lists the directories under `root`: committed checkpoints, in-flight (.tmp-*) and
// broken ones (no valid index, with the reason in `detail`), each reported as such;
// reads every index. kNotFound if `root` does not exist; kIoError if it cannot be
// listed. Damaged checkpoints are reported as entries, not as errors.
Result<RootListing> list_checkpoints(const std::string& root,
                                     std::shared_ptr<FileSystem> fs = nullptr);

// If `path` is a checkpoint directory, returns it. If it is a root, returns the newest
// committed checkpoint among those saved with update_latest (all committed ones if
// none was): the highest commit sequence number, ties going to the `latest` pointer's
// target, then to the later commit time. The sequence number (1 + that of `latest`'s
// target at save time) makes this independent of clocks, and a crash between the
// rename and the pointer update (which leaves `latest` one behind) still resumes from
// the newer checkpoint. kNotFound when there is none (naming damaged directories, if
// any); kCorruption when `latest` names a damaged checkpoint, so that a job never falls
// back to an older one silently; I/O errors of the listing.
Result<std::string> resolve_checkpoint(const std::string& path,
                                       std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace distckpt
