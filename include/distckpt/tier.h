/// The node-local tier: checkpoints kept on each node's own storage (a local disk, or
/// tmpfs such as /dev/shm), protected by the layout's replicas and by partner copies or
/// parity across nodes, committed with a record in the global root, and drained to the
/// global root in the background. docs/design.md ("The tier protocol") has the steps.
///
///   save_local   (collective) each node writes one copy of every distinct chunk its
///                ranks hold, plus the redundancy; the record commits it;
///   drain        (collective) copies a committed local checkpoint to the global root
///                as a normal checkpoint, from the local files (never the live tensors);
///   restore      (collective) loads a checkpoint from the fastest tier that has each
///                byte: own node, a surviving node over MPI, a parity rebuild, the global
///                root; onto any world size.
///
/// Every call here is collective over `comm`: all ranks call it in the same order, from
/// the thread that owns the communicator, and get the same Status. Errors name the rank,
/// the path and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/comm.h"
#include "distckpt/local_tier.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {



/// Collective. Saves `state` to every node's local tier under options.name and commits
/// it with a record in `root` (options.fs; native format only, no single-file options).
/// Until the record is committed nothing is listed. Encryption, CRC32C (always on at this
/// tier), fsync and direct I/O follow `options`. Errors: those of save(), plus
/// kInvalidArgument for an unknown redundancy, too few nodes, or a `tier` whose
/// redundancy or recycle differs between ranks; on any error no record is committed and
/// every node's temporary directory is removed.
Result<LocalSaveResult> save_local(Comm& comm, const StateDict& state, const std::string& root,
                                   const SaveOptions& options, const LocalTier& tier);

struct RestoreSources {
  uint64_t local{0};         ///< bytes each rank took from its own node's local tier (braces: Doxygen misreads "local =")
  uint64_t peer = 0;         ///< ... received from another node's local tier
  uint64_t parity = 0;       ///< ... taken from chunks rebuilt from parity
  uint64_t global = 0;       ///< ... read from the global root
  uint64_t parity_read = 0;  ///< bytes read to rebuild (segments and parity)
  uint64_t storage_read = 0;  ///< bytes read from any storage (each once per node)
  uint64_t lost_chunks = 0;   ///< local copies that were missing or failed their check
};

struct RestoreResult {
  LoadResult load;  ///< bytes_read counts storage reads
  RestoreSources sources;
  std::string name;  ///< the checkpoint restored
  /// Checkpoints passed over, newest first, each with why (losses beyond the
  /// redundancy and no global copy).
  std::vector<std::string> skipped;
  double rebuild_s = 0;
};

struct RestoreOptions {
  LoadOptions load;   ///< fs, key, strict, allow_unchecked (`only` is not supported)
  std::string name;   ///< "" : the newest checkpoint restorable from any tier
  /// With a name: when it cannot be restored from any tier, try older ones (newest first).
  bool fall_back = true;
  /// Ignore the local tier (a job that landed on other nodes): the global root only.
  bool global_only = false;
  /// For a default restore (no name): when set and it accepts at least one checkpoint
  /// that moved `latest`, only the checkpoints it accepts are tried (the manager passes a
  /// requeued job's own series, so that another job's later saves in the same root are
  /// not taken). Called on rank 0 only, from the calling thread.
  std::function<bool(const std::string& name)> prefer;
};

/// Collective. Restores a checkpoint of `root` into `state`, from the local tier
/// (`tier.dir`, may be empty: global only) and the global root. Each byte comes from the
/// first source that has it valid: this node's local tier, another node's (sent over
/// MPI), a parity rebuild, the global root; every local chunk is checked (CRC32C, AEAD)
/// before use, and one that fails counts as lost. A directory whose node id is not in
/// the record counts as empty. Any world size and layout may restore. Errors: kNotFound
/// when nothing in `root` can be restored (with each candidate's reason), load's errors.
Result<RestoreResult> restore(Comm& comm, StateDict& state, const std::string& root, const LocalTier& tier,
                              const RestoreOptions& options);

struct DrainResult {
  SaveResult save;
  double drain_s = 0;
};

/// Collective. Writes the committed local checkpoint `name` of `root` to the global root
/// as a normal checkpoint of the same name (replicas deduplicated, balanced as save()
/// does), reading the local files: each chunk is copied by a rank whose own file holds
/// it, so the drain moves no byte between nodes. It runs in the job that saved the
/// checkpoint (same ranks on the same nodes): kInvalidArgument otherwise. Encrypted chunks are authenticated as
/// they are read and sealed again under the global checkpoint's own salt (a chunk's
/// associated data names its file and offset, which differ). `options` gives fs,
/// encryption (must match the local save's key), fsync and update_latest; its name and
/// direct_io are ignored (the drain copies chunk by chunk through the page cache, in the
/// background). On failure the global root shows nothing new and the local
/// checkpoint stays.
Result<DrainResult> drain(Comm& comm, const std::string& root, const LocalTier& tier, const std::string& name,
                          const SaveOptions& options);

/// Local tier records of `root` (rank 0 or a local tool; reads the global root only).
/// Local, any thread. An empty list where the root has no records; errors: those of
/// listing the records' directory (kIoError); a record that does not parse is left out,
/// as ls leaves damaged entries out of the committed.
struct TierRecordInfo {
  std::string name;
  int64_t step = -1, epoch = -1;
  uint64_t commit_seq = 0;
  int nodes = 0;
  std::string redundancy;
  bool global = false;  ///< a global checkpoint of the same name is committed (drained)
  bool advances_latest = false;  ///< saved to move `latest` (false: an exception save): a resume candidate
};
Result<std::vector<TierRecordInfo>> list_local_records(const std::string& root, std::shared_ptr<FileSystem> fs = nullptr);

/// Collective. Removes the local checkpoint `name` of `root` from the local tier: rank 0
/// removes its record first (from then on it is not listed at this tier, and restore
/// does not use it), then every node's leader removes the node's files of it, keeping
/// them as spares with `tier.recycle`. A drained copy in the global root stays (a normal
/// checkpoint). Never call it for a checkpoint a drain is reading. Errors (agreed):
/// kInvalidArgument for a bad name, kNotFound when no record of `name` exists, the file
/// system's errors on the record.
Status remove_local(Comm& comm, const std::string& root, const LocalTier& tier, const std::string& name,
                    std::shared_ptr<FileSystem> fs = nullptr);

/// Collective. Every node's leader removes the node's spare files (LocalTier::recycle):
/// for a job that is done saving to the local tier (the manager's end() does it).
/// Best effort: never fails.
void release_local_spares(Comm& comm, const LocalTier& tier, std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace distckpt
