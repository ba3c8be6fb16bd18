#include "format/ckpt/ms_ckpt.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "format/stored.h"
#include "format/ckpt/wire.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "format/native/index_io.h"
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

std::string dims_string(const Shape& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

Status parse_tensor_proto(WireCursor& c, uint64_t end, CkptRecord& r, bool* has_type, bool* has_content) {
  while (c.pos() < end) {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    auto add_dim = [&](uint64_t v) -> Status {
      if (v > (uint64_t{1} << 62)) return c.error("tensor '" + r.tag + "': dim " + std::to_string(static_cast<int64_t>(v)) + " is negative or too large");
      if (r.dims.size() >= kMaxDims) return c.error("tensor '" + r.tag + "': more than 64 dims");
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
      if (*has_content) return c.error("tensor '" + r.tag + "': tensor_content appears twice in one record");
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("tensor '" + r.tag + "': tensor_content of " + std::to_string(n) + " bytes runs past its record");
      r.content_offset = c.pos();
      r.content_bytes = n;
      if (n <= 64 || (r.type == "str" && n <= kMaxStrBytes)) {  // info values: kept
        DISTCKPT_ASSIGN_OR_RETURN(r.small_content, c.bytes(n, kMaxStrBytes));
      } else {
        DISTCKPT_RETURN_IF_ERROR(c.skip(n));
      }
      *has_content = true;
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  if (c.pos() != end) return c.error("tensor '" + r.tag + "' overruns its length");
  return Status();
}

Status parse_value(WireCursor& c, uint64_t end, CkptRecord& r) {
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
      DISTCKPT_RETURN_IF_ERROR(parse_tensor_proto(c, c.pos() + n, r, &has_type, &has_content));
      has_tensor = true;
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  if (c.pos() != end) return c.error("record overruns its length");
  if (!has_tag || !has_tensor || !has_type || !has_content)
    return c.error("record '" + r.tag + "' lacks a required field (tag, tensor, tensor_type or tensor_content)");
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
  const std::string bytes = internal_storage::serialize_deterministic(meta);
  put_tag(out, kCkptMetaField, 2);
  put_varint(out, bytes.size());
  return out + bytes;
}

std::string ckpt_encryption_field(const proto::CkptEncryption& encryption) {
  std::string out, bytes;
  encryption.SerializeToString(&bytes);
  put_tag(out, kCkptEncryptionField, 2);
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

Result<CkptScan> scan_ckpt(const ReadableFile& file, uint64_t size, const std::string& path) {
  CkptScan scan;
  uint64_t end = size;
  if (size >= kCkptFooterBytes) {
    char tail[kCkptFooterBytes];
    DISTCKPT_RETURN_IF_ERROR(file.read_at(tail, sizeof(tail), size - sizeof(tail)));
    if (std::memcmp(tail, kFooterMagic, 7) == 0) {
      uint64_t v = 0;
      for (int i = 7; i < 17; ++i) v = (v << 8) | static_cast<uint8_t>(tail[i]);
      if (v > 0xffffffffu) return corruption("'" + path + "': the CRC footer holds " + std::to_string(v) + ", more than 32 bits");
      scan.footer = static_cast<uint32_t>(v);
      end = size - kCkptFooterBytes;
    }
  }
  WireCursor c(file, path, 0, end);
  while (!c.at_end()) {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t key, c.varint());
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field == 1 && wire == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t n, c.varint());
      if (n > end - c.pos()) return c.error("record of " + std::to_string(n) + " bytes runs past the end of the file (truncated?)");
      if (scan.records.size() >= kMaxRecords) return c.error("more than 16M records");
      CkptRecord r;
      DISTCKPT_RETURN_IF_ERROR(parse_value(c, c.pos() + n, r));
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
    } else if (field == 0) {
      return c.error("field number 0 (not a .ckpt file?)");
    } else {
      DISTCKPT_RETURN_IF_ERROR(c.skip_field(wire));
    }
  }
  scan.data_end = end;
  return scan;
}

namespace {

// Records i..j-1 of an encrypted file as one tensor: its shape comes from distckpt's
// metadata (a record's dims [0] cannot tell a scalar from an empty vector once its
// content is padded), its records must be the writer's split, and each box of a record
// is one chunk of stored length, with the next nonce and tag of the encryption field.
Result<proto::Tensor> encrypted_tensor(const CkptScan& scan, std::size_t i, std::size_t j, std::size_t* next_chunk,
                                       const std::string& where) {
  const CkptRecord& first = scan.records[i];
  const proto::CkptEncryption& e = *scan.encryption;
  const EncryptionMode mode = *encryption_mode_from_name(e.mode());
  const proto::Tensor* described = nullptr;
  for (const auto& t : scan.meta->tensors())
    if (t.name() == first.tag) described = &t;
  if (described == nullptr) return corruption(where + ": not in distckpt's metadata");
  const auto dtype = dtype_from_name(described->dtype());
  if (!dtype) return corruption(where + ": unknown dtype in distckpt's metadata");
  const Shape shape(described->global_shape().begin(), described->global_shape().end());
  const auto count = internal_layout::checked_num_elements(shape);
  const std::size_t item = dtype_size(*dtype);
  if (!count || static_cast<uint64_t>(*count) > UINT64_MAX / 16 / item)
    return corruption(where + ": its global shape overflows");
  // Before anything is sized by the (not yet authenticated) shape: the records must hold
  // at least its bytes, which bounds it by the file's size.
  uint64_t content = 0;
  for (std::size_t k = i; k < j; ++k) content += scan.records[k].content_bytes;  // each within the file
  const uint64_t plain = static_cast<uint64_t>(*count) * item;
  if (content < plain)
    return corruption(where + ": its records hold " + std::to_string(content) + " bytes, fewer than its " +
                      std::to_string(plain));
  const auto ranges = *count == 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, 0}} : ckpt_record_ranges(shape, item);
  if (j - i != ranges.size())
    return corruption(where + ": " + std::to_string(j - i) + " records, the writer makes " + std::to_string(ranges.size()));
  proto::Tensor t;
  t.set_name(first.tag);
  t.set_dtype(std::string(dtype_name(*dtype)));
  for (int64_t d : shape) t.add_global_shape(d);
  for (std::size_t k = i; k < j; ++k) {
    const CkptRecord& r = scan.records[k];
    if (r.type != kCkptEncryptedType || r.dims != first.dims)
      return corruption(where + ": an encrypted file's record of type '" + r.type + "' or other dims");
    const auto [begin, end] = ranges[k - i];
    const std::vector<Box> boxes =
        *count == 0 ? std::vector<Box>{full_box(shape)} : internal_layout::flat_range_to_boxes(shape, begin, end);
    uint64_t byte = r.content_offset;
    for (const Box& box : boxes) {
      if (*next_chunk >= static_cast<std::size_t>(e.nonce_size()))
        return corruption(where + ": more chunks than the encryption field lists");
      const uint64_t stored = internal_transform::stored_length(mode, static_cast<uint64_t>(box.num_elements()) * item);
      if (stored > r.content_offset + r.content_bytes - byte)
        return corruption(where + ": a record's tensor_content is too short for its encrypted chunks");
      auto* ch = t.add_chunks();
      for (std::size_t d = 0; d < shape.size(); ++d) {
        ch->add_offset(box.offset[d]);
        ch->add_shape(box.shape[d]);
      }
      ch->set_file_id(0);
      ch->set_byte_offset(byte);
      ch->set_length(stored);
      ch->set_writer_rank(-1);
      ch->set_nonce(e.nonce(static_cast<int>(*next_chunk)));
      ch->set_tag(e.tag(static_cast<int>(*next_chunk)));
      ++*next_chunk;
      byte += stored;
    }
    if (byte != r.content_offset + r.content_bytes)
      return corruption(where + ": a record's tensor_content of " + std::to_string(r.content_bytes) +
                        " bytes is not its encrypted chunks'");
  }
  return t;
}

}  // namespace

Result<proto::Index> ckpt_index(const CkptScan& scan, const std::string& file_name, uint64_t size,
                                const std::string& path) {
  proto::Index index;
  index = describe_single_file(scan.meta, "ckpt", "none", file_name, size);
  std::set<std::string> info_keys;
  for (const auto& [k, v] : index.info()) info_keys.insert(k);
  auto* f = index.mutable_files(0);
  if (scan.footer) {
    f->set_crc32_covered(scan.data_end);
    f->set_crc32(*scan.footer);
  }
  std::map<std::string, proto::Tensor> found;
  std::vector<std::string> order;
  std::set<std::string> seen;
  std::size_t next_chunk = 0;  // encrypted: the next nonce and tag of the encryption field
  if (scan.encryption) {
    if (!scan.meta) return corruption("'" + path + "': encrypted, but without distckpt's metadata");
    const auto& e = *scan.encryption;
    if (e.nonce_size() != e.tag_size())
      return corruption("'" + path + "': the encryption field lists " + std::to_string(e.nonce_size()) + " nonces and " +
                        std::to_string(e.tag_size()) + " tags");
    const auto mode = encryption_mode_from_name(e.mode());
    if (!mode || *mode == EncryptionMode::kNone)
      return corruption("'" + path + "': unknown encryption mode");
  }
  for (std::size_t i = 0; i < scan.records.size();) {
    std::size_t j = i + 1;
    while (j < scan.records.size() && scan.records[j].tag == scan.records[i].tag) ++j;
    const CkptRecord& first = scan.records[i];
    const std::string where = "'" + path + "': tensor '" + first.tag + "'";
    if (!seen.insert(first.tag).second) return corruption(where + " appears in two separate runs of records");
    if (info_keys.count(first.tag)) {  // distckpt's copy of an info value
      order.push_back(first.tag);
      i = j;
      continue;
    }
    // dims [0] is MindSpore's scalar, unless the record holds no bytes: then it is an
    // empty 1-d tensor (the format cannot tell them apart otherwise). dims [] is a scalar
    // too (MindSpore 2.x).
    const bool scalar = first.dims.empty() || (first.dims == Shape{0} && first.content_bytes > 0);
    if (!scan.meta && j == i + 1 && (scalar || first.dims == Shape{1})) {
      // A MindSpore file: append info is stored as scalar records.
      if (first.type == "str") {
        auto text = utf32le_to_utf8(first.small_content);
        if (!text) return corruption(where + ": a str value that is not UTF-32LE text");
        (*index.mutable_info())[first.tag].set_string_value(*text);
        order.push_back(first.tag);
        i = j;
        continue;
      }
      if ((first.tag == "epoch_num" || first.tag == "step_num") && (first.type == "Int64" || first.type == "Int32") &&
          first.content_bytes == (first.type == "Int64" ? 8u : 4u)) {
        int64_t v = 0;
        if (first.type == "Int64") std::memcpy(&v, first.small_content.data(), 8);
        else {
          int32_t v32;
          std::memcpy(&v32, first.small_content.data(), 4);
          v = v32;
        }
        (*index.mutable_info())[first.tag].set_int_value(v);
        if (first.tag == "epoch_num") index.set_epoch(v);
        else index.set_step(v);
        order.push_back(first.tag);
        i = j;
        continue;
      }
    }
    if (scan.encryption) {
      DISTCKPT_ASSIGN_OR_RETURN(proto::Tensor t, encrypted_tensor(scan, i, j, &next_chunk, where));
      order.push_back(first.tag);
      found.emplace(first.tag, std::move(t));
      i = j;
      continue;
    }
    const auto dtype = ms_type_from_name(first.type);
    if (!dtype) return corruption(where + ": unknown tensor_type '" + first.type + "'");
    const Shape shape = scalar ? Shape{} : first.dims;
    if (first.type == "str") return corruption(where + ": a str record is not a tensor");
    const auto count = internal_layout::checked_num_elements(shape);
    if (!count) return corruption(where + ": dims " + dims_string(first.dims) + " overflow");
    const uint64_t item = dtype_size(*dtype);
    proto::Tensor t;
    t.set_name(first.tag);
    t.set_dtype(std::string(dtype_name(*dtype)));
    for (int64_t d : shape) t.add_global_shape(d);
    uint64_t total = 0;  // summed with overflow in mind: each record is within the file
    for (std::size_t k = i; k < j; ++k) total += scan.records[k].content_bytes;
    if (total != static_cast<uint64_t>(*count) * item)
      return corruption(where + ": tensor_content holds " + std::to_string(total) + " bytes, dims " +
                        dims_string(first.dims) + " x " + std::to_string(item) + " bytes (" + first.type + ") need " +
                        std::to_string(static_cast<uint64_t>(*count) * item));
    int64_t at = 0;
    for (std::size_t k = i; k < j; ++k) {
      const CkptRecord& r = scan.records[k];
      if (r.type != first.type || r.dims != first.dims)
        return corruption(where + ": its records disagree on type or dims");
      if (r.content_bytes % item != 0)
        return corruption(where + ": a record's tensor_content of " + std::to_string(r.content_bytes) +
                          " bytes is not a whole number of " + first.type + " elements");
      const int64_t n = static_cast<int64_t>(r.content_bytes / item);
      if (n > *count - at)
        return corruption(where + ": tensor_content holds more than prod(dims " + dims_string(first.dims) + ") x " +
                          std::to_string(item) + " bytes");
      if (n == 0) continue;
      // A record is any element range (MindSpore 2.x cuts raw 512 MiB pieces): one
      // chunk per box of it, at its byte offset within the record.
      uint64_t byte = r.content_offset;
      for (const Box& box : internal_layout::flat_range_to_boxes(shape, at, at + n)) {
        auto* ch = t.add_chunks();
        for (std::size_t d = 0; d < shape.size(); ++d) {
          ch->add_offset(box.offset[d]);
          ch->add_shape(box.shape[d]);
        }
        const uint64_t len = static_cast<uint64_t>(box.num_elements()) * item;
        ch->set_file_id(0);
        ch->set_byte_offset(byte);
        ch->set_length(len);
        ch->set_writer_rank(-1);
        byte += len;
      }
      at += n;
    }
    if (at != *count)
      return corruption(where + ": tensor_content holds " + std::to_string(static_cast<uint64_t>(at) * item) +
                        " bytes, dims " + dims_string(first.dims) + " x " + std::to_string(item) + " need " +
                        std::to_string(static_cast<uint64_t>(*count) * item));
    if (*count == 0) {  // an empty tensor still needs its (empty) chunk to be described
      auto* ch = t.add_chunks();
      for (int64_t d : shape) {
        ch->add_offset(0);
        ch->add_shape(d);
      }
      ch->set_byte_offset(first.content_offset);
    }
    order.push_back(first.tag);
    found.emplace(first.tag, std::move(t));
    i = j;
  }
  if (scan.encryption) {
    const proto::CkptEncryption& e = *scan.encryption;
    if (next_chunk != static_cast<std::size_t>(e.nonce_size()))
      return corruption("'" + path + "': the encryption field lists " + std::to_string(e.nonce_size()) +
                        " chunks, the records hold " + std::to_string(next_chunk));
    proto::Encryption* enc = index.mutable_encryption();
    enc->set_mode(e.mode());
    enc->set_algorithm(e.algorithm());
    enc->set_salt(e.salt());
    enc->set_table_nonce(e.seal_nonce());
    enc->set_table_tag(e.seal_tag());
    enc->set_sealed_tensors(e.sealed());
    enc->set_associated(ckpt_sealed_aad(scan.meta_bytes, e));
    index.mutable_transforms()->set_encryption(e.algorithm());
  }
  DISTCKPT_RETURN_IF_ERROR(attach_tensors(index, std::move(found), order, scan.meta, path));
  return index;
}

}  // namespace distckpt::internal_format
