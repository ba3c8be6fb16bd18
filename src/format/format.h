// The formats distckpt reads and writes, as a table: one row per format, each pointing
// into the format's own folder (native/, ckpt/, safetensors/, hdf5/). What differs
// between formats is data in its row; code above this floor asks the row instead of
// testing which format it has. Adding a format is one folder plus one row in format.cc.
//
// Also a typed view of the index (proto::Index), so that nothing tests its string
// fields ("native", "crc32c") inline.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/format.h"
#include "distckpt/state_dict.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

namespace distckpt::internal_format {

class SequentialWriter;

// Where each chunk of a data file starts: at a multiple of kChunkAlignment bytes, the
// gap before it zeros. Native data files and integrated native
// files alike. The kernel's copy out of a memory file system (a load's pread
// from tmpfs or the page cache) runs at 1.8 x a memcpy when the file offset and the
// destination share their alignment modulo 64, 2.2 x when they differ by 16, and 4.4 x
// when they differ by 4 (one core, 256 MiB; framework tensors are 64-byte aligned, a
// float32 chunk packed back to back starts at any multiple of 4). At most 63 bytes
// per chunk.
inline constexpr uint64_t kChunkAlignment = 64;
constexpr uint64_t chunk_start(uint64_t cursor) { return (cursor + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment; }
// The bytes of a gap: at most kChunkAlignment - 1 of them.
inline constexpr char kGapZeros[kChunkAlignment] = {};

// How a sequential writer writes (see sequential_writer.h).
struct WriterOptions {
  bool ckpt_crc_footer = true;  // ckpt: MindSpore's CRC-32 footer
  // Encrypts every chunk (native); borrowed, must outlive the writer.
  const internal_transform::CheckpointCipher* cipher = nullptr;
  // Encrypts the whole file with the user's key (ckpt: MindSpore's framing); borrowed.
  const Encryption* encryption = nullptr;
  int writer_rank = 0;  // native: the data file is data-<writer_rank>.bin
  // ckpt, unencrypted: finish() also describes where the bytes went: each record's boxes
  // as chunks (boxes in the tensor as the meta shapes it, byte offsets in the file,
  // CRC32C taken as they are written) and files(0) with the file's size and the CRC-32
  // of its bytes before the footer (per-rank sets build their manifest from this).
  bool describe_chunks = false;
};

struct FormatDriver {
  Format id;
  std::string_view name;       // "native", "ckpt", "safetensors", "hdf5" (format_name)
  std::string_view extension;  // what a save appends to the name; "" for a directory
  // Names that end in one of these are files of this format (".h5" and ".hdf5").
  std::span<const std::string_view> read_extensions;
  bool single_file;         // one file (else a directory with an index)
  // Can be encrypted: per chunk with a CheckpointCipher (native), or whole with the
  // user's key in MindSpore's framing (ckpt).
  bool carries_encryption;
  bool chunk_checksums;     // its saves record a CRC32C per chunk in the index
  // Whether the first bytes of a file (at least kSniffBytes of them) are this format's;
  // null when a path is recognised otherwise (a directory).
  bool (*sniff)(std::string_view head);
  // The description of the checkpoint at `path` as an index (not yet validated as a
  // whole: read_stored_index does). kNotFound, kCorruption, kUnsupported, kIoError.
  Result<proto::Index> (*describe)(FileSystem& fs, const std::string& path);
  // Whether `meta` (metadata_of an index) can be stored: names and info keys the format
  // cannot hold are kInvalidArgument. Null: anything can.
  Status (*check_writable)(const proto::Index& meta);
  // Adds what this format's readers expect besides distckpt's metadata (MindSpore's
  // epoch_num / step_num records). Null: nothing.
  void (*add_format_info)(proto::Index& meta);
  // Creates the format's sequential writer for the entry at `path` (for a directory
  // format, the checkpoint directory, which exists: the writer creates its data file).
  Result<std::unique_ptr<SequentialWriter>> (*open_writer)(FileSystem& fs, const std::string& path,
                                                           const proto::Index& meta, const WriterOptions& options);
};

inline constexpr std::size_t kSniffBytes = 9;

// A per-rank .ckpt set's manifest (a directory whose files are rank_<r>/<name>.ckpt).
bool is_per_rank_set(const proto::Index& index);

// The row of `format` (never null: every Format has one).
const FormatDriver& driver(Format format);
// Every row, in the order detection tries them.
std::span<const FormatDriver* const> all_drivers();
// The single-file format whose read_extensions end `name`, ignoring a ".tmp-<id>"
// suffix (an in-flight save of it); null for anything else.
const FormatDriver* driver_for_file_name(std::string name);
// The format at `path`: a directory with an index is native; a file by its extension,
// else by its first bytes. Null when neither tells.
const FormatDriver* detect(FileSystem& fs, const std::string& path);

// OK when `format` can carry encryption; otherwise the error for asking it to:
// kInvalidArgument (no place for nonces and tags).
Status encryption_refused(Format format);
// Checks, before any writing, that `meta` can be stored in `format`.
Status check_writable(Format format, const proto::Index& meta);

// ---- a typed view of the index ----

// The format an index describes (an empty format field is native: indexes written
// before the field existed).
Format stored_format(const proto::Index& index);
bool is_single_file(const proto::Index& index);
// Whether every chunk carries a CRC32C (transforms.checksum "crc32c").
bool has_chunk_checksums(const proto::Index& index);
// Some data file has a whole-file CRC-32 (a .ckpt's footer).
bool has_file_crc32(const proto::Index& index);
// A .ckpt encrypted whole in AES-GCM and opened with its key: every read is authenticated.
bool authenticated_whole_file(const proto::Index& index);
// For a .ckpt encrypted whole in CBC and opened (no MAC in MindSpore's framing): the
// warning a read gives; "" for anything else.
std::string unauthenticated_encryption(const proto::Index& index, const std::string& path);
// Whether the data can be checked at all: chunk CRC32Cs, a whole-file CRC-32, or
// encryption (every chunk authenticated).
bool has_data_checks(const proto::Index& index);
// What checks the data, in words ("every chunk's CRC32C", "the file's CRC-32 footer",
// "structure only: no checksums recorded", ...), for reports.
std::string data_checks_text(const proto::Index& index);
// The error (kUnsupported) for data that nothing checks, unless `allowed` (unset: for a
// .ckpt or an HDF5 file, whose usual writers record no checksums); when allowed, OK with
// `*warning` set.
Status check_unchecked(const proto::Index& index, const std::string& path, std::optional<bool> allowed,
                       std::string* warning);
// The directory an index's file names are relative to: the checkpoint directory itself,
// or for a single file the directory it is in.
std::string files_dir(const proto::Index& index, const std::string& path);
// Where data file `file` of an index lives, `dir` being files_dir: <dir>/<name>, or for
// a reference (File.checkpoint, an incremental save's unchanged chunks)
// <dir's parent, the root>/<checkpoint>/<name>.
std::string data_file_location(const proto::Index& index, const std::string& dir, int file);
// The root a reference's checkpoint name is relative to: `dir`'s parent.
std::string references_root(const std::string& dir);
// Bytes of a tensor's elements (global shape x dtype; both checked by validate_index).
uint64_t tensor_bytes(const proto::Tensor& t);
// Stores `values` as the index's info values (replacing those of the same keys).
void set_info_values(const std::map<std::string, InfoValue>& values, proto::Index* index);
// The info values of an index (epoch_num, step_num, user values).
std::map<std::string, InfoValue> info_values(const proto::Index& index);
// The index's protobuf bytes with map entries sorted: equal indexes, equal bytes.
std::string serialize_deterministic(const proto::Index& index);

}  // namespace distckpt::internal_format
