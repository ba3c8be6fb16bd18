#include "transform/content_hash.h"

#include <new>

#include <xxhash.h>

namespace distckpt::internal_transform {

std::string content_hash(const void* data, std::size_t n) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(data, n));
  return std::string(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical.digest));
}

ContentHasher::ContentHasher() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

ContentHasher::~ContentHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ContentHasher::update(const void* data, std::size_t n) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

std::string ContentHasher::digest() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_)));
  return std::string(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical.digest));
}

std::string content_hash_hex(const std::string& hash) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : hash) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace distckpt::internal_transform
