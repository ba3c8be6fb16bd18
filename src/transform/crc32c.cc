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

namespace {

// Polynomials over GF(2) modulo CRC32C's, in its reflected bit order (bit 31 is x^0).
constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

uint32_t multiply_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCastagnoliReflected : b >> 1;  // b * x
  }
  return product;
}

// x^(8 n) mod P: appending n zero bytes multiplies the state by it.
uint32_t shift_by_bytes(uint64_t n) {
  uint32_t power = 1u << 31;      // x^0
  uint32_t square = 1u << 23;     // x^8, squared at each bit of n
  for (; n != 0; n >>= 1) {
    if (n & 1) power = multiply_mod(square, power);
    square = multiply_mod(square, square);
  }
  return power;
}

}  // namespace

uint32_t crc32c_join(uint32_t a, uint32_t b, uint64_t length_b) {
  // The state is linear in it: extend(a, B) = extend(a, zeros) ^ extend(0, B).
  return multiply_mod(shift_by_bytes(length_b), a) ^ b;
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
