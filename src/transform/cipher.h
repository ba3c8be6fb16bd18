// Chunk encryption (OpenSSL EVP): one checkpoint's keys, sealing and opening chunks.
//
// Keys: HKDF-SHA256 of the user's key with the checkpoint's random 16-byte salt gives
// a data key (the user key's length: AES-128/192/256, SM4-128), a MAC key and an IV key
// (32 bytes each), and an index key. A fresh salt per checkpoint means fresh keys, so a
// nonce is unique as long as it is unique within the checkpoint:
//   GCM: nonce = u32 tensor number || u64 chunk number (big-endian), tag 16 bytes;
//   CBC: IV = HMAC-SHA256(IV key, the same 12 bytes)[0..16) (unpredictable, as CBC
//        needs), PKCS#7 padding, tag = HMAC-SHA256(MAC key, u64 |aad| || aad || IV ||
//        ciphertext), checked before anything is decrypted.
// The associated data is the chunk's identity (chunk_aad): a chunk moved to another
// place, or another chunk's bytes put in its place, fails authentication.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "distckpt/encryption.h"
#include "distckpt/status.h"

namespace distckpt::internal_transform {

// AES-128/192/256 (and SM4 with 16 bytes): the key sizes distckpt accepts.
inline bool valid_key_size(std::size_t n) { return n == 16 || n == 24 || n == 32; }

inline constexpr std::size_t kSaltBytes = 16;

// Stored bytes of a chunk of `plain` bytes: GCM the same, CBC padded to a whole block
// (1 to 16 bytes more).
uint64_t stored_length(EncryptionMode mode, uint64_t plain);

// The identity a chunk's authentication binds it to. `file` is the data file's name in
// a checkpoint directory, "" in a single-file checkpoint (whose name may change).
std::string chunk_aad(const std::string& tensor, uint64_t chunk, const std::string& file, uint64_t byte_offset,
                      uint64_t stored_length, uint64_t plain_length);

class CheckpointCipher {
 public:
  // Derives the checkpoint's keys. kInvalidArgument for a key length the mode does not
  // take (SM4: 16 bytes) or a salt of the wrong size; kInternal if OpenSSL fails.
  static Result<std::shared_ptr<const CheckpointCipher>> create(EncryptionMode mode, const EncryptionKey& key,
                                                                 const std::string& salt);
  // `n` fresh random bytes (RAND_bytes): salts, the tensor table's nonce. From the
  // seeded source under DISTCKPT_TEST_RANDOM_SEED (base/test_seams.h).
  static Result<std::string> random_bytes(std::size_t n);
  // `n` fresh random bytes that never come from the test seam: identities (a node's id,
  // a temporary file's name), which must differ between processes.
  static Result<std::string> unique_bytes(std::size_t n);
  ~CheckpointCipher();

  EncryptionMode mode() const { return mode_; }
  const std::string& salt() const { return salt_; }
  // "AES-256-GCM", "AES-128-CBC-HMAC-SHA256", "SM4-CBC-HMAC-SHA256", ...
  std::string algorithm() const;
  bool length_preserving() const { return mode_ == EncryptionMode::kAesGcm; }
  uint64_t stored_length(uint64_t plain) const { return internal_transform::stored_length(mode_, plain); }
  std::size_t nonce_bytes() const;
  std::size_t tag_bytes() const;
  // The nonce (GCM) or IV (CBC) of chunk `chunk` of tensor `tensor`.
  std::string chunk_nonce(uint32_t tensor, uint64_t chunk) const;

  // Streaming encryption of one chunk. update() writes at most n + 16 bytes (GCM:
  // exactly n); finish() at most 16 more (GCM: none) and gives the tag. One thread.
  class Sealer {
   public:
    ~Sealer();
    Sealer(Sealer&&) noexcept;
    Sealer& operator=(Sealer&&) = delete;
    Status update(const void* in, std::size_t n, void* out, std::size_t* out_n);
    Status finish(void* out, std::size_t* out_n, std::string* tag);

   private:
    friend class CheckpointCipher;
    struct State;
    explicit Sealer(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  Result<Sealer> begin_seal(const std::string& nonce, const std::string& aad) const;

  // Authenticates and decrypts a whole stored chunk: `stored` bytes at `in` into `plain`
  // bytes at `out` (`in` == `out` allowed). kAuthFailed on a wrong key, modified bytes,
  // nonce or tag, or another chunk's identity (`where` names the chunk); kCorruption for
  // sizes that cannot be this chunk's. Nothing is written to `out` for CBC unless the
  // tag matched; GCM decrypts before it knows, and zeroes `out` when the tag fails.
  Status open(const std::string& nonce, const std::string& aad, const void* in, uint64_t stored, void* out,
              uint64_t plain, const std::string& tag, const std::string& where) const;

  // One-shot seal and open of a small buffer (the index's tensor table) with the index
  // key, under a random nonce of nonce_bytes() the caller draws.
  Status seal_buffer(const std::string& aad, const std::string& plain, const std::string& nonce,
                     std::string* sealed, std::string* tag) const;
  Result<std::string> open_buffer(const std::string& aad, const std::string& nonce, const std::string& sealed,
                                  const std::string& tag, const std::string& where) const;

 private:
  CheckpointCipher() = default;
  Status seal_with(const std::string& key, const std::string& nonce, const std::string& aad, const std::string& plain,
                   std::string* sealed, std::string* tag) const;
  Status open_with(const std::string& key, const std::string& nonce, const std::string& aad, const void* in,
                   uint64_t stored, void* out, uint64_t plain, const std::string& tag, const std::string& where) const;
  EncryptionMode mode_ = EncryptionMode::kNone;
  std::size_t key_bytes_ = 0;
  std::string salt_;
  std::string data_key_, index_key_, mac_key_, iv_key_;
};

}  // namespace distckpt::internal_transform
