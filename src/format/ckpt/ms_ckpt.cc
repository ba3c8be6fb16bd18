#include "format/ckpt/ms_ckpt.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "base/strings.h"
#include "base/text.h"
#include "format/ckpt/wire.h"
#include "format/describe.h"
#include "format/format.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "transform/cipher.h"

namespace distckpt::internal_format {

namespace {

constexpr std::pair<DType, std::string_view> kMsTypes[] = {
    {DType::kFloat32, "Float32"}, {DType::kFloat16, "Float16"}, {DType::kBFloat16, "BFloat16"},
    {DType::kFloat64, "Float64"}, {DType::kInt8, "Int8"},       {DType::kInt16, "Int16"},
    {DType::kInt32, "Int32"},     {DType::kInt64, "Int64"},     {DType::kUInt8, "UInt8"},
    {DType::kUInt16, "UInt16"},   {DType::kUInt32, "UInt32"},   {DType::kUInt64, "UInt64"},
    {DType::kBool, "Bool"}};
constexpr char kFooterMagic[] = "crc_num";
constexpr uint64_t kMaxTagBytes = 64 << 10;
constexpr uint64_t kMaxTypeBytes = 64;
constexpr uint64_t kMaxDims = 64;
constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxStrBytes = 1 << 20;
// A record costs ~150 bytes in memory for >= 8 on disk: bound what a hostile file costs.
constexpr std::size_t kMaxRecords = std::size_t{1} << 24;

Status parse_tensor_proto(WireCursor& c, uint64_t end, CkptRecord& r, bool* has_type, bool* has_content,
                          const google::protobuf::Map<std::string, proto::InfoValue>* info_keys) {
  while (c.pos() < end) {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    auto add_dim = [&](uint64_t v) -> Status {
      if (v > (uint64_t{1} << 62)) return c.error("tensor '" + internal_base::printable(r.tag) + "': dim " + std::to_string(static_cast<int64_t>(v)) + " is negative or too large");
      if (r.dims.size() >= kMaxDims) return c.error("tensor '" + internal_base::printable(r.tag) + "': more than 64 dims");
      r.dims.push_back(static_cast<int64_t>(v));
      return Status();
    };
    if (field == 1 && wire == 0) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t v, c.varint());
      DISTCKPT_RETURN_IF_ERROR(add_dim(v));
    } else if (field == 1 && wire == 2) {  // packed dims
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("packed dims run past the tensor");
      const uint64_t stop = c.pos() + n;
      while (c.pos() < stop) {
        DISTCKPT_ASSIGN_OR_RETURN(uint64_t v, c.varint());
        DISTCKPT_RETURN_IF_ERROR(add_dim(v));
      }
      if (c.pos() != stop) return c.error("packed dims overrun their length");
    } else if (field == 2 && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      DISTCKPT_ASSIGN_OR_RETURN(r.type, c.bytes(n, kMaxTypeBytes));
      *has_type = true;
    } else if (field == 3 && wire == 2) {
      if (*has_content) return c.error("tensor '" + internal_base::printable(r.tag) + "': tensor_content appears twice in one record");
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("tensor '" + internal_base::printable(r.tag) + "': tensor_content of " + std::to_string(n) + " bytes runs past its record");
      r.content_offset = c.pos();
      r.content_bytes = n;
      // A tensor's content is outside the structure checksum (its chunks have their own);
      // an info record's (its tag in distckpt's metadata, read first) is inside.
      c.set_crc_paused(info_keys == nullptr || !info_keys->count(r.tag));
      if (n <= 64 || (r.type == "str" && n <= kMaxStrBytes)) {  // info values: kept
        DISTCKPT_ASSIGN_OR_RETURN(r.small_content, c.bytes(n, kMaxStrBytes));
      } else {
        DISTCKPT_RETURN_IF_ERROR(c.skip(n));
      }
      c.set_crc_paused(false);
      *has_content = true;
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  if (c.pos() != end) return c.error("tensor '" + internal_base::printable(r.tag) + "' overruns its length");
  return Status();
}

Status parse_value(WireCursor& c, uint64_t end, CkptRecord& r,
                   const google::protobuf::Map<std::string, proto::InfoValue>* info_keys) {
  bool has_tag = false, has_tensor = false, has_type = false, has_content = false;
  while (c.pos() < end) {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      DISTCKPT_ASSIGN_OR_RETURN(r.tag, c.bytes(n, kMaxTagBytes));
      has_tag = true;
    } else if (field == 2 && wire == 2) {
      if (has_tensor) return c.error("a record holds two tensors");
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("tensor runs past its record");
      DISTCKPT_RETURN_IF_ERROR(parse_tensor_proto(c, c.pos() + n, r, &has_type, &has_content, info_keys));
      has_tensor = true;
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  if (c.pos() != end) return c.error("record overruns its length");
  if (!has_tag || !has_tensor || !has_type || !has_content)
    return c.error("record '" + internal_base::printable(r.tag) + "' lacks a required field (tag, tensor, tensor_type or tensor_content)");
  return Status();
}

}  // namespace

std::string utf8_to_utf32le(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    std::size_t len = 1;
    if (c >= 0xf0) { cp = c & 0x07; len = 4; }
    else if (c >= 0xe0) { cp = c & 0x0f; len = 3; }
    else if (c >= 0xc0) { cp = c & 0x1f; len = 2; }
    for (std::size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((cp >> (8 * b)) & 0xff));
    i += len;
  }
  return out;
}

std::optional<std::string> utf32le_to_utf8(const std::string& s) {
  if (s.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < s.size(); i += 4) {
    uint32_t cp = 0;
    for (int b = 3; b >= 0; --b) cp = (cp << 8) | static_cast<unsigned char>(s[i + static_cast<std::size_t>(b)]);
    if (cp == 0) break;  // numpy pads fixed-width strings with NULs
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return std::nullopt;
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

std::string_view ms_type_name(DType t) {
  for (const auto& [d, n] : kMsTypes)
    if (d == t) return n;
  return "";
}

std::optional<DType> ms_type_from_name(std::string_view name) {
  for (const auto& [d, n] : kMsTypes)
    if (n == name) return d;
  return std::nullopt;
}

std::string ckpt_record_header(const std::string& tag, const Shape& dims, std::string_view type,
                               uint64_t content_bytes) {
  std::string tensor;  // TensorProto without the content bytes
  for (int64_t d : dims) {
    put_tag(tensor, 1, 0);
    put_varint(tensor, static_cast<uint64_t>(d));
  }
  put_tag(tensor, 2, 2);
  put_varint(tensor, type.size());
  tensor.append(type);
  put_tag(tensor, 3, 2);
  put_varint(tensor, content_bytes);
  const uint64_t tensor_len = tensor.size() + content_bytes;
  std::string value;
  put_tag(value, 1, 2);
  put_varint(value, tag.size());
  value += tag;
  put_tag(value, 2, 2);
  put_varint(value, tensor_len);
  const uint64_t value_len = value.size() + tensor_len;
  std::string out;
  put_tag(out, 1, 2);
  put_varint(out, value_len);
  return out + value + tensor;
}

std::string ckpt_record(const std::string& tag, const Shape& dims, std::string_view type, const std::string& content) {
  return ckpt_record_header(tag, dims, type, content.size()) + content;
}

std::string ckpt_meta_field(const proto::Index& meta) {
  std::string out;
  const std::string bytes = serialize_deterministic(meta);
  put_tag(out, kCkptMetaField, 2);
  put_varint(out, bytes.size());
  return out + bytes;
}

std::string ckpt_checks_field(const proto::CkptChecks& checks) {
  std::string out, bytes;
  checks.SerializeToString(&bytes);
  put_tag(out, kCkptChecksField, 2);
  put_varint(out, bytes.size());
  return out + bytes;
}

std::string ckpt_sealed_aad(const std::string& meta_bytes, const proto::CkptEncryption& encryption) {
  proto::CkptEncryption unsealed = encryption;
  unsealed.clear_seal_nonce();
  unsealed.clear_sealed();
  unsealed.clear_seal_tag();
  std::string rest;
  unsealed.SerializeToString(&rest);
  std::string aad = "distckpt ckpt v1";
  put_varint(aad, meta_bytes.size());
  return aad + meta_bytes + rest;
}

std::string ckpt_footer(uint32_t crc32) {
  std::string out(kFooterMagic, 7);
  for (int i = 9; i >= 0; --i) out.push_back(i < 4 ? static_cast<char>((crc32 >> (8 * i)) & 0xff) : '\0');
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ckpt_record_ranges(const Shape& shape, std::size_t item_size) {
  const int64_t total = full_box(shape).num_elements();
  const uint64_t bytes = static_cast<uint64_t>(total) * item_size;
  if (bytes <= kCkptRecordBytes || shape.empty()) return {{0, total}};
  const int64_t parts = static_cast<int64_t>((bytes + kCkptRecordBytes - 1) / kCkptRecordBytes);
  // numpy.array_split: the first (n % parts) parts get one extra unit.
  const bool by_rows = shape[0] >= parts;
  const int64_t units = by_rows ? shape[0] : total, unit = by_rows ? total / shape[0] : 1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t at = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t n = units / parts + (p < units % parts ? 1 : 0);
    ranges.emplace_back(at * unit, (at + n) * unit);
    at += n;
  }
  return ranges;
}

Result<std::optional<proto::Index>> read_leading_meta(const ReadableFile& file, uint64_t size, const std::string& path) {
  WireCursor c(file, path, 0, size);
  if (c.at_end()) return std::optional<proto::Index>();
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
  if (key != (uint64_t{kCkptMetaField} << 3 | 2)) return std::optional<proto::Index>();
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
  DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, c.bytes(n, kMaxMetaBytes));
  proto::Index meta;
  if (!meta.ParseFromString(bytes)) return c.error("distckpt's metadata field does not parse");
  return std::optional<proto::Index>(std::move(meta));
}

Result<CkptScan> scan_ckpt(const ReadableFile& file, uint64_t size, const std::string& path) {
  CkptScan scan;
  uint64_t end = size;
  if (size >= kCkptFooterBytes) {
    char tail[kCkptFooterBytes];
    DISTCKPT_RETURN_IF_ERROR(file.read_at(tail, sizeof(tail), size - sizeof(tail)));
    if (std::memcmp(tail, kFooterMagic, 7) == 0) {
      // 10 big-endian bytes, of which a CRC-32 fills the last 4 (the first 6 are zero; a
      // 64-bit accumulator would drop the first 2, so each is checked).
      uint64_t v = 0;
      for (int i = 7; i < 13; ++i)
        if (tail[i] != 0) return corruption("'" + path + "': the CRC footer holds more than 32 bits");
      for (int i = 13; i < 17; ++i) v = (v << 8) | static_cast<uint8_t>(tail[i]);
      scan.footer = static_cast<uint32_t>(v);
      end = size - kCkptFooterBytes;
    }
  }
  WireCursor c(file, path, 0, end);
  while (!c.at_end()) {
    const uint32_t structure = c.crc();  // before this field's tag
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("record of " + std::to_string(n) + " bytes runs past the end of the file (truncated?)");
      if (scan.records.size() >= kMaxRecords) return c.error("more than 16M records");
      CkptRecord r;
      DISTCKPT_RETURN_IF_ERROR(parse_value(c, c.pos() + n, r, scan.meta ? &scan.meta->info() : nullptr));
      scan.records.push_back(std::move(r));
    } else if (field == kCkptMetaField && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, c.bytes(n, kMaxMetaBytes));
      proto::Index meta;
      if (!meta.ParseFromString(bytes)) return c.error("distckpt's metadata field does not parse");
      scan.meta = std::move(meta);
      scan.meta_bytes = std::move(bytes);
    } else if (field == kCkptEncryptionField && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, c.bytes(n, kMaxMetaBytes));
      proto::CkptEncryption encryption;
      if (!encryption.ParseFromString(bytes)) return c.error("distckpt's encryption field does not parse");
      scan.encryption = std::move(encryption);
    } else if (field == kCkptChecksField && wire == 2) {
      scan.structure_crc32c = structure;  // everything before the field
      c.set_crc_paused(true);
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, c.bytes(n, kMaxMetaBytes));
      c.set_crc_paused(false);
      proto::CkptChecks checks;
      if (scan.checks || !checks.ParseFromString(bytes)) return c.error("distckpt's checksums field does not parse");
      scan.checks = std::move(checks);
    } else if (field == 0) {
      return c.error("field number 0 (not a .ckpt file?)");
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  scan.data_end = end;
  return scan;
}

}  // namespace distckpt::internal_format
