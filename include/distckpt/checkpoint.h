/// Saving and loading a StateDict: the collective calls of a training job.
///
/// A checkpoint is a directory <root>/<name>/ holding data-NNNNN.bin files (one per
/// writing rank) and index.pb (the protobuf index, written last by rank 0). It exists
/// if and only if that final-named directory exists with a valid index: saves go to
/// <root>/<name>.tmp-<id>/ and are renamed only after every rank succeeded (see
/// src/catalog/commit.cc for the protocol, step by step). Reading checkpoints without a
/// job (list, inspect, verify) is in inspect.h; converting and publishing in convert.h.
///
/// Collective functions (save, load) must be called by every rank of the Comm, in the
/// same order, with state dicts describing the same tensors. They return the same
/// Status on every rank: if one rank fails, all fail with that rank's error, nothing
/// new becomes visible, and no earlier checkpoint is touched. They are called from
/// the thread that owns the Comm.
#pragma once

#include <cstddef>
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
#include "distckpt/format.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

/// How a save writes: shared by SaveOptions (one save) and CheckpointConfig (every
/// save a CheckpointManager makes).
struct SaveSettings {
  /// Write each unique slice once (replicas removed, writing balanced by bytes).
  /// When false, every rank writes every box it holds (for debugging / parity).
  bool remove_redundancy = true;
  bool fsync = true;          ///< fsync files and directories (commit protocol steps 2-3)
  /// CRC32C of every chunk, computed while the bytes are hot and checked by load and
  /// verify. Off only to measure its cost (ckpt_bench --no-checksum): the index is
  /// checksummed either way, the data then is not (Checksum::kNone).
  /// Sharded native saves only; integrated saves and single files keep their checksums.
  bool checksum = true;
  /// Write data files with O_DIRECT through aligned staging buffers where the file
  /// system allows it (buffered I/O otherwise). Faster and steadier on the machines we
  /// measured: see src/storage/stream_writer.h. Sharded native saves.
  bool direct_io = true;
  std::shared_ptr<FileSystem> fs;  ///< null: POSIX
  /// Encrypt the checkpoint (encryption.h): every chunk's bytes, and the index's tensor
  /// table. Every rank passes the same mode and key (compared by fingerprint, never sent;
  /// kInvalidArgument otherwise). Native checkpoints (sharded, integrated, asynchronous),
  /// and .ckpt files, which are encrypted whole in MindSpore 2.x's framing with the key
  /// as given (MindSpore's load_checkpoint(dec_key, dec_mode) reads them; without the key
  /// nothing of them is readable, names and step included; they carry no CRC footer; in
  /// AES-CBC and SM4-CBC nothing authenticates them, and loads say so). safetensors and
  /// HDF5 cannot carry it and refuse (kInvalidArgument).
  Encryption encryption;

  /// ---- single-file (integrated) saves ----
  Format format = Format::kNative;
  /// Whether split tensors are merged into whole ones (MindSpore's integrated_save).
  /// Unset: the format's own way (native: sharded; .ckpt and safetensors: one integrated
  /// file; HDF5: one shared file whose datasets every rank writes into, no gather).
  ///   true,  kNative: full tensors (reconstructed with gather_region) in one data file
  ///                   written by `writer_rank`, instead of each rank writing its slices.
  ///   false, kCkpt:   a per-rank set, MindSpore's integrated_save=False: the directory
  ///                   <root>/<name>/ holds rank_<r>/<name>.ckpt for every rank r (the
  ///                   layout of MindSpore's transform_checkpoints), each a MindSpore .ckpt
  ///                   of that rank's slices under the tensors' names, with the slice's
  ///                   place in the global tensor in distckpt's metadata field, and
  ///                   index.pb, the manifest (files, sizes, CRCs, where every slice is),
  ///                   written by rank 0 after every rank fsynced and all agreed: the set
  ///                   is committed by the native protocol and listed, loaded, converted
  ///                   and retired as one checkpoint. With remove_redundancy each distinct
  ///                   slice is in one rank's file (the others hold only info values).
  ///                   A rank holding two boxes of one tensor (explicit layouts) and
  ///                   encryption are kInvalidArgument. <name> loses a trailing ".ckpt".
  ///   false, kSafetensors: kInvalidArgument (a safetensors file holds whole tensors).
  ///   false/true, kHdf5: as unset.
  std::optional<bool> integrated;
  /// Rank that writes an integrated file (ckpt, safetensors, native + integrated).
  int writer_rank = 0;
  /// Bytes of a tensor reconstructed at a time: the writer holds two such regions (one
  /// being written while the next is gathered) plus the staging of pieces that are not
  /// contiguous in a region, so its memory beyond its own state is at most 3x this. A
  /// region is whole rows of dim 0 (one row if a row is larger).
  uint64_t gather_bytes = uint64_t{64} << 20;
  /// kCkpt: append MindSpore's CRC-32 footer ("crc_num"), checked on load and verify.
  /// MindSpore >= 2.1 reads it; turn it off for older MindSpore readers.
  bool ckpt_crc_footer = true;
};

/// One save: what it is called and what it records, and how it writes.
struct SaveOptions : SaveSettings {
  /// Directory name under root. Must be non-empty, without '/', not "latest", not
  /// containing ".tmp-". Saving onto an existing checkpoint fails with kAlreadyExists.
  std::string name;
  int64_t step = -1;   ///< recorded in the index; -1 = unknown
  int64_t epoch = -1;  ///< recorded in the index; -1 = unknown
  /// Move <root>/latest to this checkpoint after commit. false makes a side snapshot:
  /// listed and loadable by path, but never picked by resolve_checkpoint / resume.
  bool update_latest = true;
  /// Incremental save (sharded native, not encrypted; kInvalidArgument otherwise): every
  /// chunk's XXH3-128 is recorded, and a chunk whose bytes hash and measure the same as
  /// the base's chunk of the same tensor and box is not written again: the index
  /// references the file that holds it (catalog/references.h says what keeps such files
  /// and what retiring a referenced checkpoint leaves). The base is `incremental_base`,
  /// a committed checkpoint of `root` (kNotFound if it is not), or when empty the one
  /// `latest` names (unless incremental_from_latest is false; none: everything is
  /// written, and hashed for the next save). A base that is encrypted, in another
  /// format, or saved without incremental contributes nothing; a chunk whose base file
  /// holds less than half live data is written again rather than referenced, so that
  /// old files can go. Needs checksums (kInvalidArgument without). Costs one hashing
  /// pass over the rank's chunks (on the caller's thread, async saves included). Every
  /// rank passes the same `incremental` (kInvalidArgument otherwise); the base is rank 0's.
  bool incremental = false;
  std::string incremental_base;
  bool incremental_from_latest = true;
  /// false: a named base that is gone, replaced or busy (the root's references lock held
  /// past its timeout) costs a full save instead of failing it (the manager's choice).
  bool incremental_base_required = true;
};

struct SaveResult {
  std::string path;             ///< <root>/<name> (single files: with the format's extension)
  uint64_t bytes_unique = 0;    ///< size of the state once (sum of global tensor sizes)
  uint64_t bytes_written = 0;   ///< data bytes written by all ranks (excludes the index)
  /// Incremental saves: data bytes of unchanged chunks, referenced instead of written
  /// (bytes_written + bytes_referenced is the checkpoint's data), and the base.
  uint64_t bytes_referenced = 0;
  std::string incremental_base;
  uint64_t rank_bytes_written = 0;  ///< by this rank
  uint64_t index_bytes = 0;
  double plan_s = 0, write_s = 0, commit_s = 0;  ///< wall time of each phase on this rank
  /// Non-fatal problem after the commit (e.g. `latest` could not be moved); empty if none.
  std::string warning;
};

/// Collective. Saves `state` under `root` (created if missing). Buffers in `state` are
/// only read, during the call; nothing is kept after it returns. Info values are taken
/// from rank 0's state dict. Errors, identical on all ranks: kInvalidArgument (bad name,
/// layouts naming ranks outside the communicator, state dicts that disagree across
/// ranks on names, order, dtypes, shapes or layouts, boxes that do not tile a tensor; an
/// explicit layout must be built identically on every rank, every member's boxes in the
/// same order, because rank 0 plans every rank's writes from its own copy),
/// kAlreadyExists (the name is taken), kIoError and any other error of the file system,
/// kInternal (a bug). On error nothing new is visible under `root` and existing
/// checkpoints are untouched; a leftover <name>.tmp-* directory can remain only if the
/// cleanup itself failed. Non-fatal problems after the commit are in SaveResult::warning.
/// Extra memory per rank (docs/guide/cpp.md "Memory each operation takes";
/// mpi_tests/memory_bound checks it): sharded
/// native: 32 MiB of staging with direct I/O (buffered: a 512 KiB bounce buffer per
/// writing thread where the kernel's first touch of a page traps, docs/design.md "Where it
/// must be fast"; 4 MiB more when encrypted),
/// plus O(index) on rank 0 (the plan and the index: a few times index_bytes); integrated
/// files: the writer 3 x gather_bytes, the other ranks at most gather_bytes of pieces
/// that are not contiguous in their buffers; per-rank .ckpt sets: 1 MiB of record
/// buffering; HDF5: O(index). Incremental: the base's index on rank 0, O(index), more.
/// Tensor bytes are written from the caller's buffers (buffered: through the bounce
/// buffer where there is one).
Result<SaveResult> save(Comm& comm, const StateDict& state, const std::string& root,
                        const SaveOptions& options);

struct LoadOptions {
  /// true: every tensor of `state` must be in the checkpoint (else kMismatch naming it).
  /// false: missing tensors are skipped and reported in LoadResult.
  bool strict = true;
  /// false (default): a stored tensor that no tensor of `state` takes (after the filters
  /// and renames below) fails the load with kMismatch naming it, before any byte is read,
  /// as torch's load_state_dict(strict=True) refuses unexpected keys. true: such tensors
  /// are left out and reported in LoadResult::unexpected_in_checkpoint. A load with
  /// `only` loads a chosen subset: nothing is refused as unexpected there. Stored tensors
  /// the filters leave out (specify_prefix, filter_prefix, choice_func) are not unexpected.
  bool allow_unexpected = false;
  /// Load only these names (all of `state` when empty). Every name must be in `state`.
  std::vector<std::string> only;
  /// Which stored tensors the load sees, by their names in the checkpoint (MindSpore 2.x's
  /// load_checkpoint): only those starting with a specify_prefix entry (all when empty),
  /// none starting with a filter_prefix entry, then only those choice_func accepts. A
  /// state tensor whose stored tensor is left out is missing (strict: kMismatch saying
  /// so). Overlapping specify/filter prefixes and empty prefixes are kInvalidArgument.
  /// choice_func is called on every rank and must answer alike everywhere.
  std::vector<std::string> specify_prefix;
  std::vector<std::string> filter_prefix;
  std::function<bool(const std::string& stored_name)> choice_func;
  /// Stored name -> state-dict name (loading into a renamed module), or a function doing
  /// the same (not both); applied after the filters. Two stored tensors renamed to one
  /// name, or a rename to "", are kInvalidArgument.
  std::map<std::string, std::string> rename;
  std::function<std::string(const std::string& stored_name)> rename_func;
  /// Never implicit: a stored floating tensor (float16, bfloat16, float32, float64) loads
  /// into a state tensor of another floating dtype only when this is set (fp32 master
  /// weights into a bf16 model). Rounded to nearest, ties to even; NaN stays NaN,
  /// infinities and signed zeros are kept, values beyond the target's range become
  /// infinities. Integer and bool dtypes are never cast (kMismatch). Costs a staging
  /// buffer of the stored dtype per box that is cast, on the rank loading it.
  bool cast_floats = false;
  std::shared_ptr<FileSystem> fs;  ///< null: POSIX
  /// Who reads a box that several ranks (replicas) need. kShared: one member of the
  /// replica group reads and checks it, then sends it to the others over the
  /// communicator (bytes read from storage / replica count). kEach: every rank reads for
  /// itself. kAuto (default): kShared when the communicator spans several nodes or the
  /// load reads directly (direct_reads: the page cache then cannot serve a second
  /// reader); kEach on one node with buffered reads, where the page cache already serves
  /// the second reader (docs/design.md "Where it must be fast" has the
  /// measurements). kShared falls back to kEach when ranks do not load the same tensors in
  /// order.
  enum class ReplicaReads { kAuto, kShared, kEach };
  ReplicaReads replica_reads = ReplicaReads::kAuto;
  /// How chunks needed whole are read. true (default): past the page cache (O_DIRECT),
  /// gathered into long sequential reads through staging slabs of 2 MiB pages and copied
  /// into the buffers, checked as they are copied; only native checkpoints (chunks with
  /// their own CRC32C), from files that allow it and are not mostly in the page cache
  /// already, and never on a memory file system. false: buffered preads straight into the
  /// buffers. Cold loads on ext4 over virtio (docs/benchmarks.md, cold loads):
  /// 1 GiB in 0.76-0.81 x the buffered time, 4 GiB in 0.50 x. Encrypted chunks and
  /// chunks needed in part are always read buffered.
  bool direct_reads = true;
  /// A stored chunk only partly needed (a load into another layout): false (default)
  /// reads only the byte ranges needed (read amplification 1.0), which its CRC32C, taken
  /// over the whole chunk, cannot check; true reads the whole chunk and checks it. Chunks
  /// needed whole are always checked. verify_checkpoint() checks every byte.
  /// (Encrypted chunks are always read whole: a part of one cannot be authenticated.)
  bool check_partial_chunks = false;
  /// Pieces of a chunk under 4 KiB (a split on a trailing dimension: TP3 of a column
  /// split saved at TP2): false (default) reads each exactly, batched through io_uring
  /// where the kernel allows it (else one pread each), so bytes_read == bytes_needed;
  /// true reads slabs of whole rows (up to 8 MiB) and copies the pieces out (ROMIO's data
  /// sieving: more bytes, fewer calls), kept to compare the two (ckpt_bench --compare-sieve).
  bool sieve_small_runs = false;
  /// The key of an encrypted checkpoint (kAuthFailed without it, or with a wrong one).
  std::shared_ptr<const EncryptionKey> key;
  /// A checkpoint whose data nothing checks: a native one saved with checksum = false, a
  /// safetensors file from another writer, a .ckpt MindSpore wrote without its CRC-32
  /// footer (its default, crc_check=False), an HDF5 file from h5py (every .ckpt and HDF5
  /// file distckpt writes carries checksums). Unset: such a .ckpt or HDF5 file loads with a
  /// warning (LoadResult::warning), as MindSpore's load_checkpoint and h5py read them, and
  /// the others are refused with kUnsupported. true: all load with the warning. false: all
  /// are refused (MindSpore's crc_check=True on a load).
  std::optional<bool> allow_unchecked;
};

struct LoadResult {
  int64_t step = -1;
  int64_t epoch = -1;
  std::map<std::string, InfoValue> info;
  std::vector<std::string> loaded;
  std::vector<std::string> missing_in_checkpoint;    ///< asked for, not in the checkpoint
  std::vector<std::string> unexpected_in_checkpoint;  ///< in the checkpoint, not asked for
  std::vector<std::string> filtered_out;  ///< stored names left out by the load's filters
  uint64_t rank_bytes_read = 0;  ///< data bytes this rank read
  uint64_t bytes_read = 0;       ///< summed over ranks
  /// Bytes of the boxes this rank read for (its own, and with shared replica reads those
  /// it sends), summed over ranks: bytes_read / bytes_needed is the read amplification
  /// (1.0 unless check_partial_chunks, or sieve_small_runs).
  uint64_t rank_bytes_needed = 0;
  uint64_t bytes_needed = 0;
  /// Pieces under 4 KiB read (sieve_small_runs: slabs), by this rank and by all, and how
  /// (over all ranks): "io_uring", "pread", "sieving" (joined by '+' if ranks differ), or
  /// "" when no rank met one.
  uint64_t rank_small_runs = 0, small_runs = 0;
  std::string small_reads;
  /// Data bytes this rank sent to ranks on other nodes (Comm::node_of) with shared
  /// replica reads, and that summed over ranks: what crossed the network between hosts
  /// instead of being read again from storage.
  uint64_t rank_bytes_between_hosts = 0;
  uint64_t bytes_between_hosts = 0;
  /// Of bytes_read, those read directly (LoadOptions::direct_reads), by this rank and by all.
  uint64_t rank_bytes_read_direct = 0, bytes_read_direct = 0;
  /// Where this rank's time went: reading (with checksums and copies into the buffers,
  /// and the shared boxes' messages that moved meanwhile), and the wait for the messages
  /// still moving after the reads (shared replica reads).
  double read_s = 0, exchange_s = 0;
  double load_s = 0;
  /// Non-fatal: data nothing checked was loaded (a file that records no checksums, see
  /// LoadOptions::allow_unchecked); empty if none.
  std::string warning;
};

/// Collective. Fills the buffers of `state` from the checkpoint directory `path` (a
/// root is resolved to its newest committed checkpoint, see resolve_checkpoint). Each
/// rank reads only the bytes of its boxes (any layout: stored chunks are intersected with
/// the boxes), checks the CRC32C of every chunk it reads whole (partly needed chunks: see
/// LoadOptions::check_partial_chunks), and copies them into its buffers. A global shape
/// differing only by trailing dims of size 1 is accepted. Thread: the communicator's.
/// Memory: `state`'s buffers are borrowed and written. Extra memory per rank (docs/guide/cpp.md
/// "Memory"; mpi_tests/memory_bound checks it): 32 MiB of staging for direct reads (4
/// slabs of 8 MiB, made as the reads need them, none when nothing is read directly);
/// scratch of at most the largest stored chunk the rank reads in part (a piece that is
/// not contiguous in its buffer, or a chunk read whole to be checked or decrypted), 1 MiB
/// for batched pieces under 4 KiB, the stored dtype's copy of boxes cast (cast_floats),
/// a 512 KiB bounce buffer per reading thread where buffered reads bounce (docs/design.md
/// "Where it must be fast"), 4 MiB of receive slots where replicas exchange and
/// receives bounce (kept by the process: at most 2 sets), and O(index). Errors, identical on all ranks: kNotFound (no
/// checkpoint, missing data file), kCorruption (bad index, truncated file, checksum,
/// chunks not covering a needed box), kMismatch (dtype, global shape, missing tensor when
/// strict), kUnsupported (newer index version), kInvalidArgument (a name in `only` that is
/// not in `state`, a state dict built for another rank), kAuthFailed (encrypted: no key,
/// a wrong key, a modified, moved or swapped chunk or index, naming it; or a key given
/// for a checkpoint that is not encrypted), kIoError. All metadata checks (names, dtypes,
/// shapes, coverage, files and their sizes, the encrypted index's authentication) pass on
/// every rank before any buffer is written, so those errors leave `state` untouched;
/// only a checksum or chunk authentication error found while reading can leave buffers
/// partly overwritten (a chunk that fails authentication is zeroed, not left as read).
Result<LoadResult> load(Comm& comm, StateDict& state, const std::string& path,
                        const LoadOptions& options);

/// A checkpoint's tensors in memory the library owns (load_all).
struct LoadedCheckpoint {
  std::string path;  ///< the checkpoint read (a root gives its newest)
  int64_t step = -1, epoch = -1;
  std::map<std::string, InfoValue> info;
  /// The tensors, under their names after LoadOptions' renames, each with the layout it
  /// was loaded in; their buffers point into `storage`, which moving this struct keeps
  /// valid (the state can be saved or converted as it is).
  StateDict state{0};
  std::vector<std::unique_ptr<std::byte[]>> storage;
  LoadResult result;
};

/// How load_all lays the tensors out over the communicator's ranks.
enum class LoadAllLayout {
  kFull,    ///< every rank holds every tensor whole
  kStored,  ///< each rank holds its slices of the layout at save (device matrix and tensor
            /// map as saved; explicit layouts: the boxes each rank wrote, replicas having
            /// been written once). Needs at least as many ranks as the save had.
};

/// Collective. Every tensor of the checkpoint at `path` the options' filters keep
/// (specify_prefix, filter_prefix, choice_func, with their renames; `only` must be empty:
/// the caller does not describe the tensors), in buffers this call allocates, without
/// the caller describing the tensors first: what an evaluation script, a converter or a
/// restart that builds its model from the checkpoint needs. Reads as load() does (same
/// checks, keys, replica sharing). Extra memory per rank: the bytes of the tensors it
/// holds (kFull: the whole checkpoint's tensors; kStored: its slices), plus load()'s.
/// Errors: load()'s, identical on every rank; kInvalidArgument for `only`, or for
/// kStored with fewer ranks than the save had.
Result<LoadedCheckpoint> load_all(Comm& comm, const std::string& path, LoadAllLayout layout,
                                  const LoadOptions& options = {});
/// Local, any thread: the same on one process, every tensor whole, without MPI.
Result<LoadedCheckpoint> load_all(const std::string& path, const LoadOptions& options = {});

}  // namespace distckpt
