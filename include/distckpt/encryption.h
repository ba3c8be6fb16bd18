/// Encryption of checkpoints: modes and keys.
///
/// An encrypted checkpoint (SaveOptions::encryption) stores every chunk's bytes
/// encrypted and authenticated, each chunk under its own nonce with its identity (tensor,
/// chunk number, file, offset, lengths) as associated data, so a chunk cannot be
/// modified, moved or swapped with another unnoticed. Its tensor table (names, dtypes,
/// shapes, layouts, chunk boxes, checksums and tags) is sealed in the index the same way.
/// Step, epoch, info values and file sizes stay readable, so checkpoints can be listed,
/// ordered and retained without the key (docs/guide/security.md).
///
/// Keys are 16, 24 or 32 bytes (AES-128/192/256; SM4 takes 16). Each checkpoint's keys
/// are derived from it and a random per-checkpoint salt (HKDF-SHA256), so no nonce is
/// ever reused under a key. distckpt never logs, prints or writes a key.
///
/// A MindSpore .ckpt is encrypted instead as MindSpore 2.x encrypts one (save_checkpoint
/// with enc_key and enc_mode): the whole file, in blocks of at most 64 MiB, each under a
/// random IV and the key itself (src/transform/ms_framing.h), so that MindSpore decrypts
/// it. Nothing of it is readable without the key. AES-GCM authenticates each block;
/// AES-CBC and SM4-CBC authenticate nothing (loads warn; distckpt's per-record CRC32Cs
/// still catch accidental damage). .ckpt files distckpt 0.1.0 encrypted chunk by chunk
/// are still read.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/status.h"

namespace distckpt {

/// kAesGcm: AES-GCM (the default; authenticated encryption).
/// kAesCbc, kSm4Cbc: CBC with PKCS#7 padding, as MindSpore offers them. In a native
/// checkpoint authenticated by an HMAC-SHA256 of the ciphertext (encrypt-then-MAC, checked
/// before decrypting); in a .ckpt (MindSpore's framing) not authenticated at all.
enum class EncryptionMode { kNone, kAesGcm, kAesCbc, kSm4Cbc };

/// "none", "AES-GCM", "AES-CBC", "SM4-CBC" (MindSpore's enc_mode names). Both name
/// functions are local, thread-safe and cannot fail; names are views of static storage.
std::string_view encryption_mode_name(EncryptionMode mode);
/// Inverse of encryption_mode_name, case-insensitive; nullopt for anything else.
std::optional<EncryptionMode> encryption_mode_from_name(std::string_view name);

/// Key bytes, wiped from memory when destroyed. Copyable (each copy is wiped); any
/// thread; every function is local (a key read per rank is compared across ranks by the
/// save that uses it). Never printed: messages about a key name its source, not its bytes.
class EncryptionKey {
 public:
  /// kInvalidArgument unless `bytes` has 16, 24 or 32 bytes.
  static Result<EncryptionKey> from_bytes(std::string_view bytes);
  /// A key file holds either the raw 16/24/32 bytes (`openssl rand 32 > key`) or their
  /// 32/48/64 hex digits, optionally followed by a newline (`openssl rand -hex 32`). A
  /// file of 32 bytes that are all hex digits is read as hex (a 16-byte key).
  /// kNotFound, kIoError, or kInvalidArgument for any other content (the message gives
  /// the file's size, never its bytes).
  static Result<EncryptionKey> from_file(const std::string& path);
  /// The environment variable `variable` holds the key as 32/48/64 hex digits.
  /// kNotFound when it is unset, kInvalidArgument for any other content.
  static Result<EncryptionKey> from_env(const std::string& variable);

  EncryptionKey(const EncryptionKey& other);
  EncryptionKey& operator=(const EncryptionKey& other);
  ~EncryptionKey();

  std::size_t size() const { return bytes_.size(); }
  /// The key's bytes, owned by this object and valid while it lives (then wiped).
  const unsigned char* data() const { return bytes_.data(); }

 private:
  EncryptionKey() = default;
  std::vector<unsigned char> bytes_;
};

/// What a save encrypts with: on when there is a key (AES-GCM unless `mode` says
/// otherwise). `key` is shared, never copied into the checkpoint. A key with mode kNone,
/// or AES-CBC / SM4-CBC without a key, is refused (kInvalidArgument): neither can mean
/// "no encryption" by accident.
struct Encryption {
  EncryptionMode mode = EncryptionMode::kAesGcm;
  std::shared_ptr<const EncryptionKey> key;
  bool enabled() const { return key != nullptr; }
  /// Local, any thread. OK, or kInvalidArgument for a key with mode kNone or CBC without
  /// a key.
  Status validate() const;
};

}  // namespace distckpt
