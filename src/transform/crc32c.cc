#include "transform/crc32c.h"

#include <isa-l/crc.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>

namespace distckpt::internal_transform {

uint32_t crc32c_extend(uint32_t state, const void* data, std::size_t n) {
  // ISA-L takes an int length: feed large buffers in 1 GiB pieces.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (n > 0) {
    const std::size_t piece = std::min<std::size_t>(n, std::size_t{1} << 30);
    state = crc32_iscsi(p, static_cast<int>(piece), state);
    p += piece;
    n -= piece;
  }
  return state;
}

uint32_t crc32_zlib(uint32_t crc, const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const std::size_t piece = std::min<std::size_t>(n, std::size_t{1} << 30);
    crc = crc32_gzip_refl(crc, p, piece);
    p += piece;
    n -= piece;
  }
  return crc;
}

uint32_t crc32_zlib_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

std::string crc32c_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", crc);
  return buf;
}

std::string crc32c_mismatch(uint32_t actual, uint32_t recorded) {
  return "crc32c " + crc32c_hex(actual) + " != recorded " + crc32c_hex(recorded);
}

}  // namespace distckpt::internal_transform
