// The native format: a checkpoint directory holding data-NNNNN.bin files (one per
// writing rank) and index.pb, the protobuf index framed with a magic, a version, a
// CRC32C and a length. This codec reads, writes and validates the index; the names of
// the files inside a checkpoint directory belong to it too (the root's names, such as
// `latest` and ".tmp-<id>", are the catalog's: catalog/names.h).
#pragma once

#include <string>
#include <string_view>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"
#include "format/native/file_names.h"

namespace distckpt::internal_format {

// The newest version of the on-disk index this build writes (2: an encrypted checkpoint,
// which builds that know only version 1 must refuse rather than read as empty; 3: an
// index that references other checkpoints' files, which older builds would look for in
// the wrong directory; 4: an index whose info holds a distckpt.torch state tree, whose
// plain values (optimizer hyper-parameters, scheduler state) older builds would drop
// without a word; other checkpoints are still written as 1). Newer versions are refused
// on read.
inline constexpr uint32_t kIndexFormatVersion = 4;
// The info value that holds a distckpt.torch application state's tree (typed JSON: the
// plain values and where each tensor goes). Written by the Python layer.
inline constexpr std::string_view kStateTreeInfoKey = "distckpt.torch.state";
// Bounds on numbers read from an index, checked before anything is sized by them: the
// world size, and the rank entries the layouts name in all (what a summary lists).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
inline constexpr int64_t kMaxListedRanks = int64_t{1} << 26;  // 16,384 ranks x 4,096 tensors

// "data-00003.bin" for writer rank 3.
std::string data_file_name(int writer_rank);
// Whether `name` can be the name of a file inside a checkpoint directory: non-empty, at
// most 255 bytes, no '/' or NUL, not ".", ".." or the index's own name.
bool valid_file_name(const std::string& name);
// A data file named by an index: a valid_file_name, or (per-rank .ckpt sets)
// "rank_<r>/<valid_file_name>" with r a decimal rank of at most 8 digits, or (a checkpoint
// of an object root) "s-<16 hex digits>/<valid_file_name>": its save's own prefix.
bool valid_data_file_name(const std::string& name);
// "s-<16 hex>" of a save into an object root: the prefix its data objects are under, so
// that no other save of the same name can write them (catalog/object_root.h).
bool valid_save_dir(std::string_view dir);
// The name a data file's chunks are encrypted under: `name` without an object root's
// save prefix (its writer encrypted them before the prefix was known to the index).
std::string file_identity(const std::string& name);
// "rank_3/<name>.ckpt": rank 3's file of a per-rank set named `name`.
std::string per_rank_file_name(int rank, const std::string& name);

// The oldest index version that can hold `index` (kIndexFormatVersion's list): what
// frame_index writes, so that a build that cannot read it refuses it.
uint32_t index_version(const proto::Index& index);

// Frame: "DCKPTIDX" | u32 version | u32 crc32c(payload) | u64 payload length | payload.
// The version is index_version(index): 4 with a distckpt.torch state tree, else 3 when it
// references another checkpoint's files, else 2 when encrypted, else 1.
std::string frame_index(const proto::Index& index);
// The same frame around payload bytes as they are (fuzzing, tests of hostile payloads).
std::string frame_payload(const std::string& payload, uint32_t version = kIndexFormatVersion);
// Checks the frame, the version (kUnsupported if newer), the checksum, the protobuf
// and every number in it (see validate_index). `path` is used in messages.
Result<proto::Index> parse_index(const std::string& bytes, const std::string& path);
// Reads the bytes of <dir>/index.pb, checking the header against the file's size
// before reading (and allocating for) the rest.
Result<std::string> read_index_bytes(FileSystem& fs, const std::string& dir, const char* file = kIndexFileName);
// A reference's identity (File.checkpoint, incremental saves): <root>/<checkpoint> must
// hold an index (index.pb, or index.retired once retired) whose commit_seq is the one
// the reference records; kCorruption otherwise (the checkpoint was replaced or copied
// there), naming both.
Status check_reference_identity(FileSystem& fs, const std::string& root, const proto::File& file);
// Whether `bytes` start with the index's magic (a framed index, not a description).
bool is_framed_index(const std::string& bytes);
// Reads <dir>/index.pb and parses it.
Result<proto::Index> read_index(FileSystem& fs, const std::string& dir);
// Every commit number is below this (validate_index refuses others): the next one, the
// highest + 1, can be checked against it and never wraps.
inline constexpr uint64_t kCommitSeqLimit = uint64_t{1} << 62;
// Semantic checks: known dtypes, non-negative dims without overflow, chunks inside
// the tensor and inside their file, lengths that match the box, file names confined
// to the checkpoint directory, the distinct chunks covering each tensor, a commit
// number below kCommitSeqLimit.
Status validate_index(const proto::Index& index, const std::string& path);

// The native format's row of the format table (format.h).
const struct FormatDriver& native_driver();

}  // namespace distckpt::internal_format
