// CRC32C (Castagnoli), hardware-accelerated through ISA-L's crc32_iscsi.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distckpt::internal_transform {

// Streaming: state = crc32c_extend(state, data, n) starting from kCrc32cInit, then
// crc32c_finish(state). crc32c("123456789") == 0xE3069283.
inline constexpr uint32_t kCrc32cInit = 0xFFFFFFFFu;
uint32_t crc32c_extend(uint32_t state, const void* data, std::size_t n);
inline uint32_t crc32c_finish(uint32_t state) { return ~state; }
inline uint32_t crc32c(const void* data, std::size_t n) { return crc32c_finish(crc32c_extend(kCrc32cInit, data, n)); }

}  // namespace distckpt::internal_transform
