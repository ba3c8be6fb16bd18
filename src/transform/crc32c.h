// CRC32C (Castagnoli), hardware-accelerated through ISA-L's crc32_iscsi.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distckpt::internal_transform {

// Streaming: state = crc32c_extend(state, data, n) starting from kCrc32cInit, then
// crc32c_finish(state). crc32c("123456789") == 0xE3069283.
inline constexpr uint32_t kCrc32cInit = 0xFFFFFFFFu;
uint32_t crc32c_extend(uint32_t state, const void* data, std::size_t n);
inline uint32_t crc32c_finish(uint32_t state) { return ~state; }
inline uint32_t crc32c(const void* data, std::size_t n) { return crc32c_finish(crc32c_extend(kCrc32cInit, data, n)); }

// The CRC32C of A+B from crc32c(A), crc32c(B) and B's length (as zlib's crc32_combine
// does for CRC-32): pieces checksummed apart, by several ranks, give the whole's.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// CRC32C as a linear map, for pieces of one message checksummed apart and far from each
// other (the runs several ranks write into one HDF5 dataset). With
//   R(M) = crc32c(M) ^ crc32c_zeros(|M|)   (linear: R(A xor B) = R(A) xor R(B)),
// a piece P placed with `after` bytes after it contributes
//   crc32c_multiply(crc32c_shift_factor(after), R(P)),
// the XOR of all pieces' contributions is R(M), and crc32c(M) = R(M) ^ crc32c_zeros(|M|).
uint32_t crc32c_zeros(uint64_t n);              // the CRC32C of n zero bytes
uint32_t crc32c_shift_factor(uint64_t bytes);   // x^(8 bytes) modulo the polynomial
uint32_t crc32c_multiply(uint32_t a, uint32_t b);  // a * b modulo the polynomial

// CRC-32 as zlib's crc32() and Python's binascii.crc32 compute it (MindSpore's .ckpt
// footer): crc = crc32_zlib(crc, data, n) starting from 0. crc32_zlib(0, "123456789")
// == 0xCBF43926.
uint32_t crc32_zlib(uint32_t crc, const void* data, std::size_t n);
// zlib's crc32_combine: the CRC-32 of A+B from those of A and B and B's length.
uint32_t crc32_zlib_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// "0x1a2b3c4d".
std::string crc32c_hex(uint32_t crc);
// "crc32c 0x1a2b3c4d != recorded 0x9c8d7e6f", for error messages.
std::string crc32c_mismatch(uint32_t actual, uint32_t recorded);

}  // namespace distckpt::internal_transform
