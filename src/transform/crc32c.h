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

// "0x1a2b3c4d".
std::string crc32c_hex(uint32_t crc);
// "crc32c 0x1a2b3c4d != recorded 0x9c8d7e6f", for error messages.
std::string crc32c_mismatch(uint32_t actual, uint32_t recorded);

}  // namespace distckpt::internal_transform
