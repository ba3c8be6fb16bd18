// Reading and writing the native index (index.pb) and naming rules for checkpoints.
#pragma once

#include <string>

#include "distckpt/checkpoint.h"
#include "distckpt/filesystem.h"
#include "distckpt/encryption.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

namespace distckpt::internal_storage {

inline constexpr const char* kIndexFileName = "index.pb";
inline constexpr const char* kLatestFileName = "latest";
inline constexpr const char* kTmpMarker = ".tmp-";
// Bounds on numbers read from an index, checked before anything is sized by them: the
// world size, and the rank entries the layouts name in all (what a summary lists).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
inline constexpr int64_t kMaxListedRanks = int64_t{1} << 26;  // 16,384 ranks x 4,096 tensors

// "data-00003.bin" for writer rank 3.
std::string data_file_name(int writer_rank);

// kInvalidArgument unless `name` can be a checkpoint directory name: non-empty, at
// most 255 bytes, no '/', no NUL, not "." / ".." / "latest", no ".tmp-".
Status validate_checkpoint_name(const std::string& name);

// The index's protobuf bytes with map entries sorted: equal indexes, equal bytes.
std::string serialize_deterministic(const proto::Index& index);
// Frame: "DCKPTIDX" | u32 version | u32 crc32c(payload) | u64 payload length | payload.
// Version 2 when the index is encrypted, 1 otherwise.
std::string frame_index(const proto::Index& index);
// The same frame around payload bytes as they are (fuzzing, tests of hostile payloads).
std::string frame_payload(const std::string& payload, uint32_t version = kIndexFormatVersion);
// Checks the frame, the version (kUnsupported if newer), the checksum, the protobuf
// and every number in it (see validate_index). `path` is used in messages.
Result<proto::Index> parse_index(const std::string& bytes, const std::string& path);
// Reads the bytes of <dir>/index.pb, checking the header against the file's size
// before reading (and allocating for) the rest.
Result<std::string> read_index_bytes(FileSystem& fs, const std::string& dir);
// Reads <dir>/index.pb and parses it.
Result<proto::Index> read_index(FileSystem& fs, const std::string& dir);
// Semantic checks: known dtypes, non-negative dims without overflow, chunks inside
// the tensor and inside their file, lengths that match the box, file names confined
// to the checkpoint directory, the distinct chunks covering each tensor.
Status validate_index(const proto::Index& index, const std::string& path);

// Encrypted checkpoints: moves the index's tensors into its sealed tensor table (with
// the encryption record: mode, algorithm, `salt`, the table's nonce and tag). The
// last change before the index is framed: everything else is authenticated with it.
Status seal_index(proto::Index* index, const internal_transform::CheckpointCipher& cipher, const std::string& salt);
// Opens an encrypted index in place: derives the checkpoint's cipher from `key`,
// authenticates and decrypts the tensor table into `index->tensors`, and validates the
// result. Returns null for an index that is not encrypted (untouched) when `key` is
// null. kAuthFailed without a key, with a key of the wrong size or with a wrong key,
// when any part of the index was modified, or for an unencrypted index given a key
// (a downgrade); kCorruption for a table that does not parse or validate.
Result<std::shared_ptr<const internal_transform::CheckpointCipher>> open_index(proto::Index* index,
                                                                              const EncryptionKey* key,
                                                                              const std::string& path);

// Authenticates and decrypts chunk `c` of `t` from its stored bytes `in` into `out`
// (the bytes of its box; `in` == `out` allowed). `file` is its data file's name, "" in
// a single file (the chunk's identity: transform/cipher.h). Errors as
// CheckpointCipher::open, naming `where`.
Status open_chunk(const internal_transform::CheckpointCipher& cipher, const proto::Tensor& t, int c,
                  const std::string& file, const void* in, void* out, const std::string& where);

// Stores `values` as the index's info values (replacing those of the same keys).
void set_info_values(const std::map<std::string, InfoValue>& values, proto::Index* index);
// The info values of an index (epoch_num, step_num, user values).
std::map<std::string, InfoValue> info_values(const proto::Index& index);

CheckpointInfo to_checkpoint_info(const proto::Index& index, const std::string& path);

}  // namespace distckpt::internal_storage
