/// Converting a checkpoint to another format, and publishing one as a single shareable
/// file. Local (one process, no communicator); thread-safe for distinct destinations.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/status.h"

namespace distckpt {

struct ConvertOptions {
  bool fsync = true;
  bool ckpt_crc_footer = true;  ///< as SaveOptions::ckpt_crc_footer
  /// Bytes of a tensor held at a time (whole rows of dim 0; a native source reads at
  /// least one stored chunk at a time, so its largest chunk bounds memory too).
  uint64_t region_bytes = uint64_t{64} << 20;
  /// Called after each region with bytes done, bytes in total and the tensor's name.
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
  /// Convert only the tensors whose names equal or start with one of these (empty: all).
  /// Each entry must select at least one tensor (kInvalidArgument otherwise: a typo
  /// would silently drop what it meant to keep).
  std::vector<std::string> only;
  /// Leave out the tensors whose names equal or start with one of these (LoadOptions'
  /// filter_prefix; overlapping `only` is kInvalidArgument), then rename (stored name ->
  /// name in the copy, LoadOptions' rename): a rename that names no converted tensor, or
  /// gives two tensors one name, is kInvalidArgument, as is an `exclude` entry that names
  /// no tensor. Filters see the stored names.
  std::vector<std::string> exclude;
  std::map<std::string, std::string> rename;
  std::shared_ptr<FileSystem> fs;  ///< null: POSIX
  std::shared_ptr<const EncryptionKey> key;  ///< the source's, when it is encrypted
  /// Encrypt the destination (native or ckpt; a new salt, so new keys and nonces).
  /// Other formats refuse (kInvalidArgument).
  Encryption encryption;
  /// A conversion is an export: once committed, its files and directories take the modes
  /// the process's umask gives (0666 / 0777 less the umask). true keeps a checkpoint's own
  /// owner-only modes (0600 / 0700). POSIX file systems only (`fs` null).
  bool owner_only = false;
  /// Replace `dst` when it is a committed checkpoint (the CLI's --force): it is retired, as
  /// remove_checkpoint does, just before the copy takes its name. Anything else there (a
  /// stray file, an entry in flight) is never replaced: kAlreadyExists, as without it.
  bool replace_existing = false;
};

struct ConvertResult {
  std::string path;         ///< what was written (single files: with their extension)
  uint64_t bytes = 0;       ///< tensor bytes converted
  uint64_t bytes_read = 0;  ///< bytes read from the source
};

/// Local, thread-safe for distinct destinations. Streams the checkpoint `src` (any
/// format; a root gives its newest) into a new checkpoint `dst` of format `to`: tensors
/// with their names, dtypes, shapes and layouts at save, step, epoch and info values.
/// Memory: one region of region_bytes plus, from a native source, the largest stored chunk
/// (read whole to be checked), plus O(index) (docs/guide/cpp.md "Memory each operation takes"; mpi_tests/memory_bound
/// checks it on the 256 MiB workload). The result is committed like a
/// save (written as <dst>.tmp-<id>, fsynced, renamed without replacing) but never moves
/// a `latest` pointer. Errors: those of read_checkpoint_info and load for the source
/// (kCorruption on a checksum mismatch), kAlreadyExists when `dst` exists,
/// kInvalidArgument for names `to` cannot hold, kIoError.
Result<ConvertResult> convert_checkpoint(const std::string& src, const std::string& dst, Format to,
                                         const ConvertOptions& options = {});

struct PublishOptions {
  /// A single-file format: kSafetensors (default), kCkpt or kHdf5.
  Format format = Format::kSafetensors;
  /// The tensors to publish, by name or name prefix (MMEngine's published_keys, e.g.
  /// {"model."} to leave the optimizer out); empty: all. Each must select a tensor.
  std::vector<std::string> only;
  std::string directory;  ///< where the file goes; "" : beside the source checkpoint
  bool fsync = true;
  bool ckpt_crc_footer = true;
  uint64_t region_bytes = uint64_t{64} << 20;  ///< as ConvertOptions::region_bytes
  std::shared_ptr<FileSystem> fs;              ///< null: POSIX
  /// The source's key, when it is encrypted. The published file is not encrypted: it is
  /// meant to be shared (publish to native or ckpt with convert_checkpoint to keep it so).
  std::shared_ptr<const EncryptionKey> key;
  bool owner_only = false;  ///< as ConvertOptions::owner_only: false follows the umask
};

struct PublishResult {
  std::string path;    ///< <directory>/<source name>-<first 8 hex digits of sha256><ext>
  std::string sha256;  ///< of the whole file, 64 lowercase hex digits
  uint64_t file_bytes = 0;
  std::vector<std::string> tensors;  ///< published
  std::vector<std::string> dropped;  ///< in the source, left out by `only`
  bool already_published = false;    ///< an identical file was there already
};

/// Local, thread-safe for distinct sources. Exports the checkpoint `src` (any format; a
/// root gives its newest), or the tensors `only` selects, as one integrated file whose
/// name carries the first 8 hex digits of its SHA-256 (MMEngine's published
/// checkpoints). The file is reproducible: no clock or directory state is stored in
/// it, so publishing the same checkpoint (same name, tensors, layouts at save, step,
/// epoch and info) twice gives the same bytes and name (the second call, or a
/// concurrent one, finds the file and returns already_published). It is committed like
/// a save (temporary name, fsync, rename without replacing) and never moves `latest`;
/// resume never picks it. Memory: as convert_checkpoint. Errors: those of
/// convert_checkpoint (a damaged source is refused before anything is written),
/// kInvalidArgument for a format that is not a single file or an `only` entry that
/// selects nothing, kAlreadyExists when a different file has the same name.
Result<PublishResult> publish_checkpoint(const std::string& src, const PublishOptions& options = {});

}  // namespace distckpt
