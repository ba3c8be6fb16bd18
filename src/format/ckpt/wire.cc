#include "format/ckpt/wire.h"

#include <algorithm>

#include "transform/crc32c.h"

namespace distckpt::internal_format {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

std::size_t varint_size(uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

uint32_t WireCursor::crc32c_extend_bytes(uint32_t state, const char* p, std::size_t n) {
  return internal_transform::crc32c_extend(state, p, n);
}

uint32_t WireCursor::crc() const { return internal_transform::crc32c_finish(crc_); }

Status WireCursor::error(const std::string& what) const {
  return corruption("'" + path_ + "' at byte " + std::to_string(pos_) + ": " + what);
}

// Makes [pos_, pos_ + need) available in buf_ (need <= the window size).
Status WireCursor::fill(std::size_t need) {
  if (need > end_ - std::min(pos_, end_)) return error("record runs past the end of its data");
  if (pos_ >= buf_start_ && pos_ + need <= buf_start_ + buf_.size()) return Status();
  constexpr uint64_t kWindow = 64 << 10;
  const uint64_t n = std::min<uint64_t>(std::max<uint64_t>(kWindow, need), end_ - pos_);
  buf_.resize(n);
  DISTCKPT_RETURN_IF_ERROR(file_.read_at(buf_.data(), n, pos_));
  buf_start_ = pos_;
  return Status();
}

Result<uint64_t> WireCursor::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    DISTCKPT_RETURN_IF_ERROR(fill(1));
    const auto byte = static_cast<uint8_t>(buf_[pos_ - buf_start_]);
    add_crc(&buf_[pos_ - buf_start_], 1);
    ++pos_;
    if (shift == 63 && byte > 1) return error("varint overflows 64 bits");
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  return error("varint longer than 10 bytes");
}

Result<std::string> WireCursor::bytes(uint64_t n, uint64_t max_bytes) {
  if (n > max_bytes) return error("field of " + std::to_string(n) + " bytes exceeds the limit of " + std::to_string(max_bytes));
  if (n > end_ - std::min(pos_, end_)) return error("field of " + std::to_string(n) + " bytes runs past its end");
  std::string out(n, '\0');
  if (n <= (64 << 10)) {
    DISTCKPT_RETURN_IF_ERROR(fill(n));
    std::copy_n(buf_.data() + (pos_ - buf_start_), n, out.data());
  } else {
    DISTCKPT_RETURN_IF_ERROR(file_.read_at(out.data(), n, pos_));
  }
  add_crc(out.data(), out.size());
  pos_ += n;
  return out;
}

Status WireCursor::skip(uint64_t n) {
  if (n > end_ - std::min(pos_, end_)) return error("field of " + std::to_string(n) + " bytes runs past its end");
  // Skipped bytes count in the running CRC unless it is paused: read them in windows.
  while (!crc_paused_ && n > 0) {
    const std::size_t step = static_cast<std::size_t>(std::min<uint64_t>(n, 64 << 10));
    DISTCKPT_RETURN_IF_ERROR(fill(step));
    add_crc(&buf_[pos_ - buf_start_], step);
    pos_ += step;
    n -= step;
  }
  pos_ += n;
  return Status();
}

Status WireCursor::skip_field(uint32_t wire_type) {
  switch (wire_type) {
    case 0: return varint().status();
    case 1: return skip(8);
    case 2: {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, varint());
      return skip(n);
    }
    case 5: return skip(4);
    default: return error("unsupported wire type " + std::to_string(wire_type));
  }
}

}  // namespace distckpt::internal_format
