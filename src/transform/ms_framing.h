// MindSpore's encrypted-file framing, as MindSpore 2.x writes and reads it
// (mindspore/core/utils/crypto.cc at commit a64e3b749f2430ea2822675d62a0465dcd9ffddf):
// save_checkpoint(enc_key=..., enc_mode=...) encrypts the whole serialized .ckpt as a
// sequence of blocks, each the encryption of at most 64 MiB of it under a fresh random
// 16-byte IV:
//   i32 magic          0x7F3A5ED8 AES-GCM, 0x7F3A5ED9 AES-CBC, 0x7F3A5EDA SM4-CBC
//   16 bytes           the GCM tag (AES-GCM only)
//   i32 block_size     4 + 16 + 4 + cipher_len: the bytes that follow it
//   i32 iv_len         16
//   16 bytes           the IV
//   i32 cipher_len
//   cipher_len bytes   GCM: as long as the plaintext; CBC: PKCS#7-padded to 16 bytes
// Integers are little-endian (MindSpore writes its hosts' int32). The key is used as it
// is given (16/24/32 bytes: AES-128/192/256; SM4 takes 16), with no associated data.
// A GCM block is authenticated by its tag; a CBC block by nothing (there is no MAC).
// Nothing binds a block to its place in the file: the order and number of blocks are
// checked only by what the plaintext's own structure checks.
//
// Early MindSpore 1.x files used one magic for every mode and no GCM tag; they are
// recognised and refused (kUnsupported), never read as authenticated.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "distckpt/encryption.h"
#include "distckpt/status.h"

namespace distckpt::internal_transform {

inline constexpr uint64_t kMsMaxBlockPlain = uint64_t{64} << 20;  // MindSpore's MAX_BLOCK_SIZE
inline constexpr std::size_t kMsIvBytes = 16, kMsTagBytes = 16;

// The mode whose magic the first 4 bytes of `head` are; nullopt for anything else
// (fewer than 4 bytes included).
std::optional<EncryptionMode> ms_framing_mode(std::string_view head);

// Bytes of a block's header (everything before its ciphertext): 48 for AES-GCM, 32 for CBC.
std::size_t ms_header_bytes(EncryptionMode mode);

// A block's header, parsed and checked.
struct MsBlockHeader {
  EncryptionMode mode = EncryptionMode::kNone;
  std::string tag;  // GCM only
  std::string iv;
  uint32_t cipher_len = 0;
};

// Parses the header at the start of `bytes` (ms_header_bytes(mode) of them) of the block
// at file offset `at`, `remaining` bytes of the file being left from there. kCorruption,
// naming `where` and the offset, for another magic than `mode`'s, a block_size or iv_len
// that is not the framing's, a cipher length that is zero, over a block's limit, not a
// whole number of CBC blocks, or past the file's end; kUnsupported for an early 1.x
// header. Local, any thread.
Result<MsBlockHeader> parse_ms_block_header(EncryptionMode mode, std::string_view bytes, uint64_t at,
                                            uint64_t remaining, const std::string& where);

// The header of a block (what parse_ms_block_header reads back).
std::string ms_block_header(const MsBlockHeader& header);

// One block's encryption or decryption with the user's key. One thread at a time per
// object; objects are independent.
class MsBlockCipher {
 public:
  // kInvalidArgument for a key length the mode does not take (SM4: 16 bytes).
  static Result<MsBlockCipher> create(EncryptionMode mode, const EncryptionKey& key);

  EncryptionMode mode() const { return mode_; }
  // "AES-256-GCM", "AES-128-CBC", "SM4-CBC".
  std::string algorithm() const;

  // Streaming encryption of one block: begin() draws a fresh IV (returned in *iv);
  // update() writes at most n + 16 bytes; finish() at most 16 more, and the GCM tag.
  Status begin(std::string* iv);
  Status update(const void* in, std::size_t n, void* out, std::size_t* out_n);
  Status finish(void* out, std::size_t* out_n, std::string* tag);

  // Decrypts a whole block's `header.cipher_len` bytes at `in` into `out` (`in` == `out`
  // allowed; `out` holds cipher_len bytes), the plaintext's length into *plain_len.
  // kAuthFailed, naming `where`, when a GCM tag does not match or CBC padding is not
  // PKCS#7 (a wrong key, or modified bytes); nothing of `out` is then meaningful.
  Status decrypt(const MsBlockHeader& header, const void* in, void* out, uint64_t* plain_len,
                 const std::string& where) const;

  // A CBC block's plaintext length, from its last two cipher blocks (`last32`: the 16
  // bytes before the last cipher block, or the IV for a one-block cipher, then the last
  // cipher block): decrypting one block reveals the padding. kAuthFailed for padding
  // that is not PKCS#7. GCM: cipher_len.
  Result<uint64_t> plain_length(const MsBlockHeader& header, std::string_view last32, const std::string& where) const;

 private:
  MsBlockCipher() = default;
  EncryptionMode mode_ = EncryptionMode::kNone;
  std::string key_;  // wiped when destroyed
  struct Stream;     // the block being encrypted
  std::shared_ptr<Stream> stream_;

 public:
  MsBlockCipher(MsBlockCipher&&) noexcept = default;
  MsBlockCipher& operator=(MsBlockCipher&&) noexcept = default;
  ~MsBlockCipher();
};

}  // namespace distckpt::internal_transform
