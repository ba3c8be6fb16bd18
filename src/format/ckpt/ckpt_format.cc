// Describing a scanned .ckpt as an index (the reader's half that knows distckpt's
// metadata and encryption), and the ckpt format's row of the format table.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "base/strings.h"
#include "base/text.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/describe.h"
#include "format/format.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "format/ckpt/framed_file.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

// "[2,3]", how a record's dims read in messages.
std::string dims_string(const Shape& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}


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
      return corruption(where + ": an encrypted file's record of type '" + internal_base::printable(r.type) +
                        "' or other dims");
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

// The info value of a scalar record of an integer, floating or boolean type (its content
// one element), or none.
std::optional<proto::InfoValue> scalar_info(const CkptRecord& r) {
  const auto dtype = ms_type_from_name(r.type);
  if (!dtype || r.content_bytes != dtype_size(*dtype) || r.small_content.size() != r.content_bytes) return std::nullopt;
  const char* p = r.small_content.data();
  proto::InfoValue v;
  auto as = [p](auto zero) {
    std::memcpy(&zero, p, sizeof(zero));
    return zero;
  };
  switch (*dtype) {
    case DType::kInt8: v.set_int_value(as(int8_t{})); break;
    case DType::kInt16: v.set_int_value(as(int16_t{})); break;
    case DType::kInt32: v.set_int_value(as(int32_t{})); break;
    case DType::kInt64: v.set_int_value(as(int64_t{})); break;
    case DType::kUInt8: v.set_int_value(as(uint8_t{})); break;
    case DType::kUInt16: v.set_int_value(as(uint16_t{})); break;
    case DType::kUInt32: v.set_int_value(as(uint32_t{})); break;
    case DType::kFloat32: v.set_float_value(as(float{})); break;
    case DType::kFloat64: v.set_float_value(as(double{})); break;
    case DType::kBool: v.set_bool_value(as(uint8_t{}) != 0); break;
    default: return std::nullopt;  // (uint64 beyond int64, 16-bit floats: tensors only)
  }
  return v;
}

// The scan's own consistency, before anything is described from it.
Status check_scan(const CkptScan& scan, const std::string& path) {
  // No writer makes a non-empty .ckpt without a record or distckpt's metadata (MindSpore
  // writes an empty file for nothing): such bytes merely happen to parse.
  if (scan.records.empty() && !scan.meta)
    return corruption("'" + path + "': no records and no metadata: damaged, or not a .ckpt");
  // What distckpt's writer said the file would hold: a file cut short at a record
  // boundary, or without its footer, parses but is damaged.
  if (scan.meta && scan.meta->has_ckpt_layout()) {
    const auto& layout = scan.meta->ckpt_layout();
    if (layout.records() != scan.records.size())
      return corruption("'" + path + "': " + std::to_string(scan.records.size()) + " records, its metadata says " +
                        std::to_string(layout.records()) + " (truncated?)");
    if (layout.footer() && !scan.footer)
      return corruption("'" + path + "': its CRC-32 footer is missing (truncated?)");
    if (layout.checks() && !scan.checks)
      return corruption("'" + path + "': its checksums field is missing (truncated?)");
  }
  if (scan.checks && (scan.encryption || !scan.meta))
    return corruption("'" + path + "': a checksums field without distckpt's metadata, or in an encrypted file");
  if (scan.checks && scan.checks->structure_crc32c() != scan.structure_crc32c)
    return corruption("'" + path + "': its metadata, record headers or info values were modified or damaged "
                      "(structure CRC32C " + internal_transform::crc32c_hex(scan.structure_crc32c) + " != " +
                      internal_transform::crc32c_hex(scan.checks->structure_crc32c()) + ")");
  return Status();
}

// A plain tensor of records [i, j) (one tag): its dtype, shape and one chunk per box of
// each record's element range, every size checked against the file's.
Result<proto::Tensor> plain_tensor(const CkptScan& scan, std::size_t i, std::size_t j, bool scalar,
                                   const std::string& where) {
  const CkptRecord& first = scan.records[i];
  const auto dtype = ms_type_from_name(first.type);
  if (!dtype) return corruption(where + ": unknown tensor_type '" + internal_base::printable(first.type) + "'");
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
  return t;
}

// Each chunk's CRC32C from distckpt's checksums field, in the order the chunks were
// described (file order); its count must equal the chunks'.
Status attach_checksums(const proto::CkptChecks& checks, const std::vector<std::string>& order,
                        std::map<std::string, proto::Tensor>* found, proto::Index* index, const std::string& path) {
  // Each chunk's CRC32C, in the order the chunks were described (file order).
  const auto& crcs = checks.chunk_crc32c();
  int next = 0;
  for (const std::string& name : order) {
    auto it = found->find(name);
    if (it == found->end()) continue;
    for (auto& ch : *it->second.mutable_chunks()) {
      if (ch.length() == 0) continue;
      if (next == crcs.size()) return corruption("'" + path + "': the checksums field lists fewer chunks than the records hold");
      ch.set_crc32c(crcs.Get(next++));
    }
  }
  if (next != crcs.size())
    return corruption("'" + path + "': the checksums field lists " + std::to_string(crcs.size()) +
                      " chunks, the records hold " + std::to_string(next));
  index->mutable_transforms()->set_checksum("crc32c");
  return Status();
}

}  // namespace

Result<proto::Index> ckpt_index(const CkptScan& scan, const std::string& file_name, uint64_t size,
                                const std::string& path) {
  DISTCKPT_RETURN_IF_ERROR(check_scan(scan, path));
  proto::Index index = describe_single_file(scan.meta, "ckpt", "none", file_name, size);
  index.clear_ckpt_layout();
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
    const std::string where = "'" + path + "': tensor '" + internal_base::printable(first.tag) + "'";
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
      // A numeric scalar (MindSpore's epoch_num, step_num, an append_info "lr") is an info
      // value too, and stays a tensor that loads where a state has one of its name.
      if (auto value = scalar_info(first)) {
        (*index.mutable_info())[first.tag] = *value;
        if (value->value_case() == proto::InfoValue::kIntValue && first.tag == "epoch_num")
          index.set_epoch(value->int_value());
        if (value->value_case() == proto::InfoValue::kIntValue && first.tag == "step_num")
          index.set_step(value->int_value());
      }
    }
    if (scan.encryption) {
      DISTCKPT_ASSIGN_OR_RETURN(proto::Tensor t, encrypted_tensor(scan, i, j, &next_chunk, where));
      order.push_back(first.tag);
      found.emplace(first.tag, std::move(t));
      i = j;
      continue;
    }
    DISTCKPT_ASSIGN_OR_RETURN(proto::Tensor t, plain_tensor(scan, i, j, scalar, where));
    order.push_back(first.tag);
    found.emplace(first.tag, std::move(t));
    i = j;
  }
  if (scan.checks) DISTCKPT_RETURN_IF_ERROR(attach_checksums(*scan.checks, order, &found, &index, path));
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

namespace {

// A Checkpoint message starts with field 1, length-delimited: a Value record (MindSpore
// writes tensors first), or with distckpt's metadata field 1000 (its tag as a varint:
// C2 3E) or encryption field 1001 (CA 3E).
bool sniff_ckpt(std::string_view head) {
  if (head.empty()) return false;
  if (head[0] == '\x0a') return true;
  return head.size() >= 2 && (head.substr(0, 2) == "\xC2\x3E" || head.substr(0, 2) == "\xCA\x3E");
}

// A .ckpt encrypted whole, seen without its key: only the file (its names are encrypted too).
proto::Index encrypted_ckpt_index(EncryptionMode mode, const std::string& name, uint64_t size) {
  proto::Index index = describe_single_file(std::nullopt, "ckpt", "none", name, size);
  index.mutable_transforms()->set_encryption(std::string(encryption_mode_name(mode)));
  proto::FileEncryption* e = index.mutable_file_encryption();
  e->set_mode(std::string(encryption_mode_name(mode)));
  e->set_stored_size(size);
  return index;
}

// A description read through the key: what the framing was.
void mark_opened(const FramingInfo& framing, proto::Index* index) {
  proto::FileEncryption* e = index->mutable_file_encryption();
  e->set_mode(std::string(encryption_mode_name(framing.mode)));
  e->set_algorithm(framing.algorithm);
  e->set_opened(true);
  e->set_blocks(framing.blocks);
  e->set_stored_size(framing.stored_size);
  index->mutable_transforms()->set_encryption(framing.algorithm);
}

Result<proto::Index> describe_ckpt(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(OpenedFile opened, open_single_file(fs, path));
  const std::string name = internal_base::base_name(path);
  if (opened.size >= 4) {
    char head[4];
    DISTCKPT_RETURN_IF_ERROR(opened.file->read_at(head, 4, 0));
    if (const auto mode = framed_mode(std::string_view(head, 4))) {
      DISTCKPT_ASSIGN_OR_RETURN(uint64_t blocks, check_framing(*opened.file, opened.size, *mode, path));
      proto::Index index = encrypted_ckpt_index(*mode, name, opened.size);
      index.mutable_file_encryption()->set_blocks(blocks);
      return index;
    }
  }
  DISTCKPT_RETURN_IF_ERROR(check_single_file_head(ckpt_driver(), *opened.file, opened.size, path));
  DISTCKPT_ASSIGN_OR_RETURN(CkptScan scan, scan_ckpt(*opened.file, opened.size, path));
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, ckpt_index(scan, name, opened.size, path));
  if (const auto framing = framing_of(*opened.file)) {
    if (scan.encryption) return corruption("'" + path + "': encrypted twice (whole, and its chunks)");
    mark_opened(*framing, &index);
  }
  return index;
}

Status check_ckpt_writable(const proto::Index& meta) {
  std::set<std::string> names;
  for (const auto& t : meta.tensors()) names.insert(t.name());
  for (const auto& [key, v] : meta.info())
    if (names.count(key))
      return invalid_argument("info value '" + key + "' has the name of a tensor: a .ckpt stores both as records");
  return Status();
}

// MindSpore's append info: epoch_num and step_num records, unless the info has them.
void add_ckpt_info(proto::Index& meta) {
  if (meta.epoch() >= 0 && !meta.info().count("epoch_num")) (*meta.mutable_info())["epoch_num"].set_int_value(meta.epoch());
  if (meta.step() >= 0 && !meta.info().count("step_num")) (*meta.mutable_info())["step_num"].set_int_value(meta.step());
}

constexpr std::string_view kCkptExtensions[] = {".ckpt"};

}  // namespace

Result<std::optional<proto::Index>> describe_framed_ckpt_summary(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(OpenedFile opened, open_single_file(fs, path));
  const auto framing = framing_of(*opened.file);
  if (!framing) return std::optional<proto::Index>();
  DISTCKPT_ASSIGN_OR_RETURN(std::optional<proto::Index> meta, read_leading_meta(*opened.file, opened.size, path));
  if (!meta) return std::optional<proto::Index>();
  const bool checks = meta->ckpt_layout().checks();
  proto::Index index = describe_single_file(*meta, "ckpt", checks ? "crc32c" : "none", internal_base::base_name(path),
                                            opened.size);
  index.clear_ckpt_layout();
  mark_opened(*framing, &index);
  return std::optional<proto::Index>(std::move(index));
}

const FormatDriver& ckpt_driver() {
  static const FormatDriver kRow{
      .id = Format::kCkpt,
      .name = "ckpt",
      .extension = ".ckpt",
      .read_extensions = kCkptExtensions,
      .single_file = true,
      .carries_encryption = true,
      .chunk_checksums = false,
      .sniff = sniff_ckpt,
      .describe = describe_ckpt,
      .check_writable = check_ckpt_writable,
      .add_format_info = add_ckpt_info,
      .open_writer = open_ckpt_writer,
  };
  return kRow;
}

}  // namespace distckpt::internal_format
