#include "format/safetensors/safetensors.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "base/text.h"
#include "format/describe.h"
#include "format/format.h"
#include "format/metadata_json.h"
#include "format/sequential_writer.h"
#include "layout/tiling.h"

namespace distckpt::internal_format {

namespace {

constexpr std::pair<DType, std::string_view> kStTypes[] = {
    {DType::kFloat32, "F32"}, {DType::kFloat16, "F16"}, {DType::kBFloat16, "BF16"}, {DType::kFloat64, "F64"},
    {DType::kInt8, "I8"},     {DType::kInt16, "I16"},   {DType::kInt32, "I32"},     {DType::kInt64, "I64"},
    {DType::kUInt8, "U8"},    {DType::kUInt16, "U16"},  {DType::kUInt32, "U32"},    {DType::kUInt64, "U64"},
    {DType::kBool, "BOOL"}};
constexpr const char* kMetadataKey = "__metadata__";


// `relative`: each tensor's offset from the start of the data. Entries are listed in
// data order: MindSpore's reader (2.5+, _fast_safe_open) requires each entry to start
// where the one before it ended.
std::string header_json(const proto::Index& meta, const std::vector<uint64_t>& relative) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::vector<int> by_offset(static_cast<std::size_t>(meta.tensors_size()));
  for (std::size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = static_cast<int>(i);
  // At one offset, empty tensors come before the one that has bytes there.
  auto key = [&](int i) { return std::make_pair(relative[static_cast<std::size_t>(i)], tensor_bytes(meta.tensors(i)) > 0); };
  std::stable_sort(by_offset.begin(), by_offset.end(), [&](int a, int b) { return key(a) < key(b); });
  for (int i : by_offset) {
    const proto::Tensor& t = meta.tensors(i);
    const uint64_t begin = relative[static_cast<std::size_t>(i)];
    j[t.name()] = {{"dtype", st_dtype_name(*dtype_from_name(t.dtype()))},
                   {"shape", std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end())},
                   {"data_offsets", {begin, begin + tensor_bytes(t)}}};
  }
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  m[kSafetensorsMetaKey] = metadata_json(meta);
  if (meta.step() >= 0) m["step_num"] = std::to_string(meta.step());
  if (meta.epoch() >= 0) m["epoch_num"] = std::to_string(meta.epoch());
  for (const auto& [key, value] : info_values(meta))
    if (key != kSafetensorsMetaKey) m[key] = info_value_to_string(value);
  j[kMetadataKey] = std::move(m);
  return j.dump();
}

}  // namespace

std::string_view st_dtype_name(DType t) {
  for (const auto& [d, n] : kStTypes)
    if (d == t) return n;
  return "";
}

std::optional<DType> st_dtype_from_name(std::string_view name) {
  for (const auto& [d, n] : kStTypes)
    if (n == name) return d;
  return std::nullopt;
}

SafetensorsLayout plan_safetensors(const proto::Index& meta) {
  SafetensorsLayout layout;
  layout.file_offset.resize(static_cast<std::size_t>(meta.tensors_size()));
  // Largest element size first: every tensor then starts aligned to its element size.
  std::vector<int> order(static_cast<std::size_t>(meta.tensors_size()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  auto item = [&](int i) { return dtype_size(*dtype_from_name(meta.tensors(i).dtype())); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return item(a) > item(b); });
  // Reserve the header for the widest CRC values so it can be written last.
  proto::Index widest = meta;
  for (auto& t : *widest.mutable_tensors())
    for (auto& c : *t.mutable_chunks()) c.set_crc32c(0xffffffffu);
  std::vector<uint64_t> relative(order.size());
  uint64_t at = 0;
  for (int i : order) {
    relative[static_cast<std::size_t>(i)] = at;
    at += tensor_bytes(meta.tensors(i));
  }
  layout.header_bytes = (header_json(widest, relative).size() + 7) / 8 * 8;
  for (std::size_t i = 0; i < relative.size(); ++i) layout.file_offset[i] = 8 + layout.header_bytes + relative[i];
  layout.file_size = 8 + layout.header_bytes + at;
  return layout;
}

Result<std::string> safetensors_header(const proto::Index& meta, const SafetensorsLayout& layout) {
  std::vector<uint64_t> relative;
  for (uint64_t off : layout.file_offset) relative.push_back(off - 8 - layout.header_bytes);
  std::string json = header_json(meta, relative);
  if (json.size() > layout.header_bytes)
    return internal_error("safetensors: the header outgrew its reservation (" + std::to_string(json.size()) + " > " +
                          std::to_string(layout.header_bytes) + " bytes)");
  json.resize(layout.header_bytes, ' ');
  std::string out(8, '\0');
  const uint64_t n = layout.header_bytes;
  std::memcpy(out.data(), &n, 8);  // little-endian hosts only (x86-64, aarch64)
  return out + json;
}

Result<proto::Index> safetensors_index(const ReadableFile& file, uint64_t size, const std::string& file_name,
                                       const std::string& path) {
  const std::string where = "safetensors '" + path + "'";
  if (size < 8) return corruption(where + ": " + std::to_string(size) + " bytes, too short for a header");
  uint64_t n = 0;
  DISTCKPT_RETURN_IF_ERROR(file.read_at(&n, 8, 0));
  if (n > kSafetensorsMaxHeader || n > size - 8)
    return corruption(where + ": header length " + std::to_string(n) + " exceeds the file or the 100 MB limit");
  std::string text(n, '\0');
  DISTCKPT_RETURN_IF_ERROR(file.read_at(text.data(), n, 8));
  // A real header nests 3 deep; a hostile one of 100 MB of '[' would cost gigabytes as
  // a JSON tree. Refuse deep nesting before parsing.
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  if (deepest > 8) return corruption(where + ": the header nests " + std::to_string(deepest) + " levels deep");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corruption(where + ": the header is not a JSON object");
  const uint64_t data_start = 8 + n, data_bytes = size - data_start;

  proto::Index index;
  std::optional<proto::Index> meta;
  if (auto m = j.find(kMetadataKey); m != j.end()) {
    if (!m->is_object()) return corruption(where + ": __metadata__ is not an object");
    for (const auto& [k, v] : m->items())
      if (!v.is_string())
        return corruption(where + ": __metadata__['" + internal_base::printable(k) + "'] is not a string");
    if (auto d = m->find(kSafetensorsMetaKey); d != m->end()) {
      DISTCKPT_ASSIGN_OR_RETURN(meta, parse_metadata_json(d->get<std::string>(), where + ": __metadata__['distckpt']"));
    }
  }
  index = describe_single_file(meta, "safetensors", meta ? "crc32c" : "none", file_name, size);

  std::map<std::string, const proto::Tensor*> described;
  if (meta)
    for (const auto& t : meta->tensors()) described[t.name()] = &t;
  std::map<std::string, proto::Tensor> found;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> ranges;
  for (const auto& [name, v] : j.items()) {
    if (name == kMetadataKey) continue;
    const std::string tw = where + ": tensor '" + internal_base::printable(name) + "'";
    if (!v.is_object()) return corruption(tw + ": not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string() || sh == v.end() || !sh->is_array() || off == v.end() ||
        !off->is_array() || off->size() != 2)
      return corruption(tw + ": needs a string dtype, a shape array and two data_offsets");
    const auto dtype = st_dtype_from_name(dt->get<std::string>());
    if (!dtype) return corruption(tw + ": unknown dtype '" + internal_base::printable(dt->get<std::string>()) + "'");
    Shape shape;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
        return corruption(tw + ": shape entries must be non-negative integers");
      shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    if (shape.size() > 64) return corruption(tw + ": more than 64 dims");
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return corruption(tw + ": data_offsets must be non-negative integers");
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    const auto count = internal_layout::checked_num_elements(shape);
    if (!count) return corruption(tw + ": the shape overflows");
    if (begin > end || end > data_bytes)
      return corruption(tw + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") run past the " + std::to_string(data_bytes) + " data bytes of the file");
    const uint64_t want = static_cast<uint64_t>(*count) * dtype_size(*dtype);
    if (end - begin != want)
      return corruption(tw + ": " + std::to_string(end - begin) + " bytes for a shape needing " + std::to_string(want));
    proto::Tensor t = whole_tensor(name, *dtype, shape, data_start + begin, want);
    if (auto it = described.find(name); it != described.end() && it->second->chunks_size() == 1)
      t.mutable_chunks(0)->set_crc32c(it->second->chunks(0).crc32c());
    ranges.push_back({{begin, end}, name});
    found.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t reach = 0;  // the furthest end so far: an overlap with any earlier tensor shows
  std::string reacher;
  for (const auto& [range, name] : ranges) {
    if (range.first == range.second) continue;  // empty tensors take no bytes
    if (range.first < reach)
      return corruption(where + ": tensors '" + internal_base::printable(reacher) + "' and '" +
                        internal_base::printable(name) + "' overlap");
    reach = range.second;
    reacher = name;
  }
  std::vector<std::string> order;
  for (const auto& r : ranges) order.push_back(r.second);
  DISTCKPT_RETURN_IF_ERROR(attach_tensors(index, std::move(found), order, meta, path));
  return index;
}

namespace {

// The 8-byte header length, then the JSON header.
bool sniff_safetensors(std::string_view head) { return head.size() > 8 && head[8] == '{'; }

Result<proto::Index> describe_safetensors(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(OpenedFile opened, open_single_file(fs, path));
  DISTCKPT_RETURN_IF_ERROR(check_single_file_head(safetensors_driver(), *opened.file, opened.size, path));
  return safetensors_index(*opened.file, opened.size, internal_base::base_name(path), path);
}

Status check_safetensors_writable(const proto::Index& meta) {
  for (const auto& t : meta.tensors())
    if (t.name() == "__metadata__")
      return invalid_argument("tensor '__metadata__' cannot be stored in safetensors (reserved key)");
  return Status();
}

constexpr std::string_view kSafetensorsExtensions[] = {".safetensors"};

}  // namespace

const FormatDriver& safetensors_driver() {
  static const FormatDriver kRow{
      .id = Format::kSafetensors,
      .name = "safetensors",
      .extension = ".safetensors",
      .read_extensions = kSafetensorsExtensions,
      .single_file = true,
      .carries_encryption = false,
      .chunk_checksums = false,
      .sniff = sniff_safetensors,
      .describe = describe_safetensors,
      .check_writable = check_safetensors_writable,
      .add_format_info = nullptr,
      .open_writer = open_safetensors_writer,
  };
  return kRow;
}

}  // namespace distckpt::internal_format
