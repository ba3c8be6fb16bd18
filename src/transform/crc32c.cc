#include "transform/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

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

}  // namespace distckpt::internal_transform
