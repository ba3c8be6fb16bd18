#include "transform/content_hash.h"

#include <xxhash.h>

namespace distckpt::internal_transform {

std::string content_hash(const void* data, std::size_t n) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(data, n));
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
