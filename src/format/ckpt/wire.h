// Protobuf wire-format primitives for formats read and written as streams of records
// (MindSpore .ckpt), where a whole message may exceed protobuf's 2 GiB limit.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/filesystem.h"
#include "distckpt/status.h"

namespace distckpt::internal_format {

void put_varint(std::string& out, uint64_t v);
std::size_t varint_size(uint64_t v);
// Tag byte(s) of field `field` with wire type `wire_type`.
void put_tag(std::string& out, uint32_t field, uint32_t wire_type);

// Sequential reader over [begin, end) of a file, buffering small reads; every read is
// bounds-checked against `end` and fails with kCorruption naming `path`.
class WireCursor {
 public:
  WireCursor(const ReadableFile& file, std::string path, uint64_t begin, uint64_t end)
      : file_(file), path_(std::move(path)), pos_(begin), end_(end) {}
  uint64_t pos() const { return pos_; }
  uint64_t end() const { return end_; }
  bool at_end() const { return pos_ >= end_; }
  Result<uint64_t> varint();
  // Reads `n` bytes into a string; refuses n > max_bytes (before allocating).
  Result<std::string> bytes(uint64_t n, uint64_t max_bytes);
  Status skip(uint64_t n);
  // Skips one field's payload of wire type `wire_type` (groups are refused).
  Status skip_field(uint32_t wire_type);
  Status error(const std::string& what) const;
  // A running CRC32C of the bytes read (varints, bytes, skips), paused over ranges the
  // caller excludes: a .ckpt's structure checksum.
  void set_crc_paused(bool paused) { crc_paused_ = paused; }
  uint32_t crc() const;

 private:
  void add_crc(const char* p, std::size_t n) {
    if (!crc_paused_) crc_ = crc32c_extend_bytes(crc_, p, n);
  }
  static uint32_t crc32c_extend_bytes(uint32_t state, const char* p, std::size_t n);
  uint32_t crc_ = 0xFFFFFFFFu;
  bool crc_paused_ = false;
  Status fill(std::size_t need);
  const ReadableFile& file_;
  std::string path_;
  uint64_t pos_, end_;
  std::string buf_;
  uint64_t buf_start_ = 0;
};

}  // namespace distckpt::internal_format
