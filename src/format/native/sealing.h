// Encryption of the native index and of chunks (transform/cipher.h does the
// cryptography; this file knows where the index keeps nonces, tags and the sealed
// tensor table).
#pragma once

#include <memory>
#include <string>

#include "distckpt/encryption.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

namespace distckpt::internal_format {

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

}  // namespace distckpt::internal_format
