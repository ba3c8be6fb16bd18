#include "format/stored.h"

#include <cstring>
#include <set>

#include "format/hdf5/hdf5_io.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/safetensors/safetensors.h"
#include "format/native/index_io.h"

namespace distckpt {

std::string_view format_name(Format format) {
  switch (format) {
    case Format::kNative: return "native";
    case Format::kCkpt: return "ckpt";
    case Format::kSafetensors: return "safetensors";
    case Format::kHdf5: return "hdf5";
  }
  return "";
}

std::optional<Format> format_from_name(std::string_view name) {
  if (name == "native") return Format::kNative;
  if (name == "ckpt") return Format::kCkpt;
  if (name == "safetensors") return Format::kSafetensors;
  if (name == "hdf5" || name == "h5") return Format::kHdf5;
  return std::nullopt;
}

}  // namespace distckpt

namespace distckpt::internal_format {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string_view format_extension(Format format) {
  switch (format) {
    case Format::kNative: return "";
    case Format::kCkpt: return ".ckpt";
    case Format::kSafetensors: return ".safetensors";
    case Format::kHdf5: return ".h5";
  }
  return "";
}

std::optional<Format> detect_format(FileSystem& fs, const std::string& path) {
  if (fs.exists(path + "/" + internal_storage::kIndexFileName)) return Format::kNative;
  if (ends_with(path, ".ckpt")) return Format::kCkpt;
  if (ends_with(path, ".safetensors")) return Format::kSafetensors;
  if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) return Format::kHdf5;
  auto file = fs.open_readable(path);
  if (!file.ok()) return std::nullopt;
  auto size = (*file)->size();
  char head[9] = {};
  if (!size.ok() || *size < sizeof(head) || !(*file)->read_at(head, sizeof(head), 0).ok()) return std::nullopt;
  if (std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) == 0) return Format::kHdf5;
  if (head[8] == '{') return Format::kSafetensors;
  if (head[0] == '\x0a') return Format::kCkpt;  // field 1, length-delimited: a Value record
  return std::nullopt;
}

Result<proto::Index> read_stored_index(FileSystem& fs, const std::string& path) {
  const auto format = detect_format(fs, path);
  if (!format || *format == Format::kNative) return internal_storage::read_index(fs, path);
  const std::string name = base_name(path);
  proto::Index index;
  if (*format == Format::kHdf5) {
    DISTCKPT_ASSIGN_OR_RETURN(index, hdf5_index(path, name));
  } else {
    auto file = fs.open_readable(path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound) return not_found("no checkpoint at '" + path + "'");
      return file.status();
    }
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, (*file)->size());
    if (*format == Format::kCkpt) {
      DISTCKPT_ASSIGN_OR_RETURN(CkptScan scan, scan_ckpt(**file, size, path));
      DISTCKPT_ASSIGN_OR_RETURN(index, ckpt_index(scan, name, size, path));
    } else {
      DISTCKPT_ASSIGN_OR_RETURN(index, safetensors_index(**file, size, name, path));
    }
  }
  if (index.name().empty()) index.set_name(name);
  DISTCKPT_RETURN_IF_ERROR(internal_storage::validate_index(index, path));
  return index;
}

Status attach_tensors(proto::Index& index, std::map<std::string, proto::Tensor> found,
                      const std::vector<std::string>& order, const std::optional<proto::Index>& meta,
                      const std::string& path) {
  if (!meta) {
    for (const auto& name : order) {
      auto it = found.find(name);
      if (it != found.end()) *index.add_tensors() = std::move(it->second);
    }
    return internal_storage::validate_index(index, path);
  }
  for (const auto& m : meta->tensors()) {
    auto it = found.find(m.name());
    if (it == found.end()) return corruption("'" + path + "': tensor '" + m.name() + "' is described but not stored");
    proto::Tensor& t = it->second;
    if (t.dtype() != m.dtype() ||
        !std::equal(t.global_shape().begin(), t.global_shape().end(), m.global_shape().begin(), m.global_shape().end()))
      return corruption("'" + path + "': tensor '" + m.name() + "': the stored dtype or shape disagrees with its description");
    *t.mutable_layout() = m.layout();
    *index.add_tensors() = std::move(t);
    found.erase(it);
  }
  if (!found.empty()) return corruption("'" + path + "': tensor '" + found.begin()->first + "' is stored but not described");
  // The description came from the file too (layouts, world size...): the reader's result
  // passes every check a native index passes, whoever calls it (read_stored_index checks
  // again; the fuzz targets call the readers directly).
  return internal_storage::validate_index(index, path);
}

proto::Index describe_single_file(const std::optional<proto::Index>& meta, const std::string& format,
                                  const std::string& checksum, const std::string& file_name, uint64_t size) {
  proto::Index index;
  if (meta) {
    index = *meta;
  } else {
    index.set_step(-1);
    index.set_epoch(-1);
  }
  index.clear_tensors();
  index.clear_files();
  // Only the file's own encryption field (ckpt_index) may say it is encrypted.
  index.clear_encryption();
  index.mutable_transforms()->set_encryption("none");
  index.set_format(format);
  index.mutable_transforms()->set_checksum(checksum);
  if (index.world_size() < 1) index.set_world_size(1);
  auto* f = index.add_files();
  f->set_name(file_name);
  f->set_size(size);
  return index;
}

proto::Tensor whole_tensor(const std::string& name, DType dtype, const Shape& shape, uint64_t byte_offset,
                           uint64_t length) {
  proto::Tensor t;
  t.set_name(name);
  t.set_dtype(std::string(dtype_name(dtype)));
  auto* ch = t.add_chunks();
  for (int64_t d : shape) {
    t.add_global_shape(d);
    ch->add_offset(0);
    ch->add_shape(d);
  }
  ch->set_file_id(0);
  ch->set_byte_offset(byte_offset);
  ch->set_length(length);
  ch->set_writer_rank(-1);
  return t;
}

proto::Index metadata_of(const proto::Index& index) {
  proto::Index meta = index;
  meta.clear_files();
  for (auto& t : *meta.mutable_tensors()) t.clear_chunks();
  // Encryption belongs to the stored bytes, not to the tensors: a copy is encrypted (or
  // not) on its own terms.
  meta.clear_encryption();
  meta.mutable_transforms()->set_encryption("none");
  return meta;
}

}  // namespace distckpt::internal_format
