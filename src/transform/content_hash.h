// The content hash of incremental saves: XXH3-128 (Debian's libxxhash), which tells a
// chunk whose bytes did not change since the last checkpoint from one that did. Not a
// cryptographic hash: it guards against accidents (a 2^-128 collision between a chunk
// and its own earlier bytes), not against someone crafting the tensor's bytes; the
// chunk's CRC32C is kept and checked on every read as before.
#pragma once

#include <cstddef>
#include <string>

namespace distckpt::internal_transform {

inline constexpr std::size_t kContentHashBytes = 16;

// XXH3-128 of `n` bytes, in its canonical (big-endian) 16-byte form.
std::string content_hash(const void* data, std::size_t n);

// The same hash over bytes that arrive in pieces (a strided box packed a piece at a
// time): equal to content_hash of the pieces concatenated. Local, one thread.
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  void update(const void* data, std::size_t n);
  std::string digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

// "9f86d081884c7d65..." (32 hex digits), for messages.
std::string content_hash_hex(const std::string& hash);

}  // namespace distckpt::internal_transform
