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

// CRC32C's polynomial, reflected. Polynomials over GF(2) below are 32-bit words with x^0
// in the top bit, as a reflected CRC holds them.
constexpr uint32_t kCastagnoli = 0x82F63B78u;

// a * b modulo the polynomial.
uint32_t multiply_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCastagnoli : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial: the shift that appending `bytes` zero bytes
// applies to a CRC, by squaring (x^(2^k) for each bit of the byte count).
uint32_t shift_for_bytes(uint64_t bytes) {
  uint32_t result = 1u << 31;    // x^0
  uint32_t power = 1u << 23;     // x^8: one byte
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = multiply_mod(power, result);
    power = multiply_mod(power, power);
  }
  return result;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return multiply_mod(shift_for_bytes(length_b), crc_a) ^ crc_b;
}

// The register starts at all ones; each zero byte multiplies it by x^8.
uint32_t crc32c_zeros(uint64_t n) { return ~multiply_mod(shift_for_bytes(n), kCrc32cInit); }
uint32_t crc32c_shift_factor(uint64_t bytes) { return shift_for_bytes(bytes); }
uint32_t crc32c_multiply(uint32_t a, uint32_t b) { return multiply_mod(a, b); }

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
