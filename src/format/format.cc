#include "format/format.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <array>

#include "base/strings.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/hdf5/hdf5_io.h"
#include "format/native/index_codec.h"
#include "format/safetensors/safetensors.h"

namespace distckpt {

std::string_view format_name(Format format) { return internal_format::driver(format).name; }

std::optional<Format> format_from_name(std::string_view name) {
  for (const auto* d : internal_format::all_drivers())
    if (d->name == name) return d->id;
  if (name == "h5") return Format::kHdf5;  // the extension, as people type it
  return std::nullopt;
}

std::string_view checksum_name(Checksum checksum) { return checksum == Checksum::kCrc32c ? "crc32c" : "none"; }

}  // namespace distckpt

namespace distckpt::internal_format {

namespace {

// Detection tries the rows in this order: the most specific signature first.
const std::array<const FormatDriver*, 4>& table() {
  static const std::array<const FormatDriver*, 4> kTable{&native_driver(), &hdf5_driver(), &safetensors_driver(),
                                                         &ckpt_driver()};
  return kTable;
}

}  // namespace

std::span<const FormatDriver* const> all_drivers() { return table(); }

const FormatDriver& driver(Format format) {
  for (const auto* d : table())
    if (d->id == format) return *d;
  return native_driver();  // unreachable: every Format has a row
}

const FormatDriver* driver_for_file_name(std::string name) {
  const auto tmp = name.find(".tmp-");
  if (tmp != std::string::npos) name.resize(tmp);
  for (const auto* d : table())
    for (std::string_view ext : d->read_extensions)
      if (name.size() > ext.size() && internal_base::ends_with(name, ext)) return d;
  return nullptr;
}

const FormatDriver* detect(FileSystem& fs, const std::string& path) {
  if (fs.exists(path + "/" + kIndexFileName)) return &native_driver();
  for (const auto* d : table())
    for (std::string_view ext : d->read_extensions)
      if (internal_base::ends_with(path, ext)) return d;
  auto file = fs.open_readable(path);
  if (!file.ok()) return nullptr;
  auto size = (*file)->size();
  char head[kSniffBytes] = {};
  if (!size.ok() || *size < sizeof(head) || !(*file)->read_at(head, sizeof(head), 0).ok()) return nullptr;
  for (const auto* d : table())
    if (d->sniff != nullptr && d->sniff(std::string_view(head, sizeof(head)))) return d;
  return nullptr;
}

Status encryption_refused(Format format) {
  if (driver(format).carries_encryption) return Status();
  return invalid_argument(std::string(format_name(format)) +
                          " files cannot carry encryption (the format has no place for nonces and tags): use the "
                          "native format");
}

Status check_writable(Format format, const proto::Index& meta) {
  const FormatDriver& d = driver(format);
  return d.check_writable != nullptr ? d.check_writable(meta) : Status();
}

Format stored_format(const proto::Index& index) {
  if (index.format().empty()) return Format::kNative;
  return format_from_name(index.format()).value_or(Format::kNative);
}

bool is_single_file(const proto::Index& index) { return driver(stored_format(index)).single_file; }

bool is_per_rank_set(const proto::Index& index) { return !is_single_file(index) && !index.per_rank_format().empty(); }

bool has_chunk_checksums(const proto::Index& index) { return index.transforms().checksum() == "crc32c"; }

bool has_file_crc32(const proto::Index& index) {
  for (const auto& f : index.files())
    if (f.crc32_covered() > 0) return true;
  return false;
}

namespace {
// A .ckpt encrypted whole and opened, by mode.
bool opened_whole(const proto::Index& index, bool gcm) {
  const proto::FileEncryption& e = index.file_encryption();
  return index.has_file_encryption() && e.opened() && (e.mode() == "AES-GCM") == gcm;
}
}  // namespace

bool authenticated_whole_file(const proto::Index& index) { return opened_whole(index, true); }

std::string unauthenticated_encryption(const proto::Index& index, const std::string& path) {
  // MindSpore's CBC framing has no MAC: whoever can write the file can change what it
  // decrypts to. Checksums still catch accidental damage.
  if (!opened_whole(index, false)) return "";
  return "'" + path + "' is encrypted with " + index.file_encryption().algorithm() +
         " in MindSpore's framing, which authenticates nothing: modified bytes go unnoticed unless a checksum "
         "catches them";
}

bool has_data_checks(const proto::Index& index) {
  return has_chunk_checksums(index) || has_file_crc32(index) || index.has_encryption() || opened_whole(index, true);
}

std::string data_checks_text(const proto::Index& index) {
  std::vector<std::string> parts;
  if (index.has_encryption()) parts.push_back("every chunk authenticated (" + index.encryption().algorithm() + ")");
  if (opened_whole(index, true))
    parts.push_back("every block authenticated (" + index.file_encryption().algorithm() + ", MindSpore's framing)");
  if (has_chunk_checksums(index))
    parts.push_back(is_single_file(index) ? "every tensor's CRC32C" : "every chunk's CRC32C");
  if (has_file_crc32(index))
    parts.push_back(index.files_size() > 1 ? "every file's CRC-32" : "the file's CRC-32 footer");
  if (has_chunk_checksums(index) && stored_format(index) == Format::kHdf5)
    parts.push_back("the structure's CRC32C footer");
  const std::string unauthenticated =
      opened_whole(index, false) ? " (" + index.file_encryption().algorithm() + ", MindSpore's framing: not authenticated)"
                                 : "";
  if (parts.empty()) return "structure only: no checksums recorded" + unauthenticated;
  std::string text = "sizes";
  for (std::size_t i = 0; i < parts.size(); ++i) text += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return text + unauthenticated;
}

Status check_unchecked(const proto::Index& index, const std::string& path, std::optional<bool> allowed,
                       std::string* warning) {
  const std::string cbc = unauthenticated_encryption(index, path);
  if (has_data_checks(index)) {
    if (!cbc.empty()) *warning = cbc;
    return Status();
  }
  const FormatDriver& d = driver(stored_format(index));
  // MindSpore writes .ckpt files without their footer by default, and loads them; HDF5
  // files from other writers (h5py, simulation codes) carry no data checksums either.
  // Those load by default, with the warning.
  const bool ckpt = d.id == Format::kCkpt, hdf5 = d.id == Format::kHdf5;
  if (allowed.value_or(ckpt || hdf5)) {
    *warning = "'" + path + "' records no checksums: its bytes are not checked" +
               (allowed  ? std::string(" (allowed)")
                : ckpt   ? " (a .ckpt without MindSpore's CRC footer)"
                         : " (an HDF5 file without distckpt's checksums)") +
               (cbc.empty() ? "" : "; " + cbc);
    return Status();
  }
  return unsupported("'" + path + "' records no checksums, so its bytes cannot be checked; allow unchecked data "
                     "to load it anyway (LoadOptions::allow_unchecked, --allow-unchecked)");
}

std::string files_dir(const proto::Index& index, const std::string& path) {
  return is_single_file(index) ? internal_base::dir_name(path) : path;
}

std::string references_root(const std::string& dir) {
  return internal_base::dir_name(internal_base::trim_trailing_slashes(dir));
}

std::string data_file_location(const proto::Index& index, const std::string& dir, int file) {
  const proto::File& f = index.files(file);
  if (f.checkpoint().empty()) return dir + "/" + f.name();
  return references_root(dir) + "/" + f.checkpoint() + "/" + f.name();
}

uint64_t tensor_bytes(const proto::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.global_shape()) n *= d;
  return static_cast<uint64_t>(n) * dtype_size(*dtype_from_name(t.dtype()));
}

void set_info_values(const std::map<std::string, InfoValue>& values, proto::Index* index) {
  for (const auto& [key, value] : values) {
    proto::InfoValue& v = (*index->mutable_info())[key];
    if (auto* i = std::get_if<int64_t>(&value)) v.set_int_value(*i);
    else if (auto* d = std::get_if<double>(&value)) v.set_float_value(*d);
    else if (auto* b = std::get_if<bool>(&value)) v.set_bool_value(*b);
    else v.set_string_value(std::get<std::string>(value));
  }
}

std::map<std::string, InfoValue> info_values(const proto::Index& index) {
  std::map<std::string, InfoValue> out;
  for (const auto& [key, v] : index.info()) {
    switch (v.value_case()) {
      case proto::InfoValue::kIntValue: out[key] = v.int_value(); break;
      case proto::InfoValue::kFloatValue: out[key] = v.float_value(); break;
      case proto::InfoValue::kBoolValue: out[key] = v.bool_value(); break;
      case proto::InfoValue::kStringValue: out[key] = v.string_value(); break;
      default: break;
    }
  }
  return out;
}


std::string serialize_deterministic(const proto::Index& index) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream coded(&raw);
    coded.SetSerializationDeterministic(true);  // map entries sorted by key
    index.SerializeToCodedStream(&coded);
  }
  return bytes;
}

}  // namespace distckpt::internal_format
