// .ckpt files encrypted whole in MindSpore's framing (transform/ms_framing.h), seen as
// their plaintext: a save writes the plaintext .ckpt through FramedWritableFile, and a
// reader holding the key opens the file through a keyed file system (with_key), so that
// describing, reading, resharding, verifying and converting run unchanged on the
// plaintext. A read decrypts (and for GCM authenticates) every block it touches whole.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"

namespace distckpt::internal_format {

// What a framed file's reader found, for its description.
struct FramingInfo {
  EncryptionMode mode = EncryptionMode::kNone;
  std::string algorithm;  // "AES-256-GCM", "AES-128-CBC", "SM4-CBC"
  uint64_t blocks = 0;
  uint64_t stored_size = 0;  // the file's bytes on disk
};

// Whether `head` (the first bytes of a file) starts a framed file, and in which mode.
std::optional<EncryptionMode> framed_mode(std::string_view head);

// Without the key: reads every block header of the framed file `file` (`size` bytes) and
// returns the number of blocks; kCorruption (naming `path`) for a framing that does not
// parse (a cut, a hostile number), kUnsupported for an early 1.x one. Same thread rules
// as `file`.
Result<uint64_t> check_framing(const ReadableFile& file, uint64_t size, EncryptionMode mode, const std::string& path);

// Encrypts what is written to it into `base`, in MindSpore's framing with `mode` and
// `key` (a fresh IV per block of 64 MiB of plaintext). Writes must be sequential
// (kInternal otherwise: the .ckpt writer only appends); sync() and close() end the
// block in progress. Owns `base`; one thread at a time. kInvalidArgument for a key the
// mode does not take.
Result<std::unique_ptr<WritableFile>> framed_writable(std::unique_ptr<WritableFile> base, EncryptionMode mode,
                                                      const EncryptionKey& key);

// `fs` seen with `key`: a .ckpt file in MindSpore's framing opens (open_readable) and
// measures (file_size) as its plaintext; every other file and operation is `fs`'s own.
// Null `key`: `fs` itself. The result shares `fs` and holds its own copy of the key
// (wiped when it goes); thread-safe as `fs` is.
// Opening a framed file reads its block headers and (CBC) decrypts each block's last 16
// bytes: kCorruption for a framing that does not parse, kAuthFailed for bad CBC padding
// (a wrong key, or modified bytes), kUnsupported for an early MindSpore 1.x framing.
// Reads decrypt whole blocks: kAuthFailed when a block fails (a wrong key fails on every
// block), kCorruption when a GCM block fails where another authenticated with this key
// (the file was modified or damaged).
std::shared_ptr<FileSystem> with_key(std::shared_ptr<FileSystem> fs, const EncryptionKey* key);

// The framing of a file opened through with_key's file system; nullopt for a plain one.
std::optional<FramingInfo> framing_of(const ReadableFile& file);

}  // namespace distckpt::internal_format
