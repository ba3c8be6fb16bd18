#include "format/describe.h"

#include <cctype>

#include "base/text.h"
#include "format/format.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_format {

namespace {

std::string format_file_name(const FormatDriver& format) {
  if (format.id == Format::kCkpt) return "MindSpore .ckpt";
  if (format.id == Format::kSafetensors) return "safetensors";
  if (format.id == Format::kHdf5) return "HDF5";
  return std::string(format.name);
}

}  // namespace

std::optional<std::string> foreign_reason(const FormatDriver& format, const ReadableFile& file, uint64_t size) {
  if (format.sniff == nullptr || size < kSniffBytes) return std::nullopt;
  char head[kSniffBytes];
  if (!file.read_at(head, sizeof(head), 0).ok()) return std::nullopt;
  const std::string_view h(head, sizeof(head));
  if (format.sniff(h)) return std::nullopt;
  if (h.substr(0, 4) == std::string_view("PK\x03\x04", 4)) return "it is a zip archive (a PyTorch or Lightning checkpoint?)";
  if (static_cast<unsigned char>(h[0]) == 0x80 && h[1] >= 2 && h[1] <= 5) return "it is a Python pickle";
  // Of the other formats, only a signature as specific as HDF5's says what it is.
  if (format.id != Format::kHdf5 && driver(Format::kHdf5).sniff(h)) return "it is an HDF5 file";
  bool text = true;
  for (char c : h) text = text && (std::isprint(static_cast<unsigned char>(c)) || std::isspace(static_cast<unsigned char>(c)));
  if (text) return "it is text";
  // Only a signature as strict as HDF5's tells a foreign file from a damaged one; other
  // formats' parsers say what is wrong with their own bytes.
  if (format.id == Format::kHdf5) return "its first bytes are not an HDF5 signature";
  return std::nullopt;
}

Status check_single_file_head(const FormatDriver& format, const ReadableFile& file, uint64_t size,
                              const std::string& path) {
  if (size == 0)
    return corruption("'" + path + "': empty file (0 bytes): damaged (truncated by a crash?), not a checkpoint");
  if (auto why = foreign_reason(format, file, size))
    return corruption("'" + path + "': not a " + format_file_name(format) + " file: " + *why);
  return Status();
}

Result<OpenedFile> open_single_file(FileSystem& fs, const std::string& path) {
  auto file = fs.open_readable(path);
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kNotFound) return not_found("no checkpoint at '" + path + "'");
    return file.status();
  }
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, (*file)->size());
  return OpenedFile{std::move(*file), size};
}

Status attach_tensors(proto::Index& index, std::map<std::string, proto::Tensor> found,
                      const std::vector<std::string>& order, const std::optional<proto::Index>& meta,
                      const std::string& path) {
  if (!meta) {
    for (const auto& name : order) {
      auto it = found.find(name);
      if (it != found.end()) *index.add_tensors() = std::move(it->second);
    }
    return validate_index(index, path);
  }
  for (const auto& m : meta->tensors()) {
    auto it = found.find(m.name());
    if (it == found.end())
      return corruption("'" + path + "': tensor '" + internal_base::printable(m.name()) + "' is described but not stored");
    proto::Tensor& t = it->second;
    if (t.dtype() != m.dtype() ||
        !std::equal(t.global_shape().begin(), t.global_shape().end(), m.global_shape().begin(), m.global_shape().end()))
      return corruption("'" + path + "': tensor '" + internal_base::printable(m.name()) +
                        "': the stored dtype or shape disagrees with its description");
    *t.mutable_layout() = m.layout();
    *index.add_tensors() = std::move(t);
    found.erase(it);
  }
  if (!found.empty())
    return corruption("'" + path + "': tensor '" + internal_base::printable(found.begin()->first) +
                      "' is stored but not described");
  // The description came from the file too (layouts, world size...): the reader's result
  // passes every check a native index passes, whoever calls it (read_stored_index checks
  // again; the fuzz targets call the readers directly).
  return validate_index(index, path);
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
  index.clear_file_encryption();  // and only its reader that it is encrypted whole
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
  meta.clear_file_encryption();
  meta.clear_ckpt_layout();
  meta.mutable_transforms()->set_encryption("none");
  return meta;
}

}  // namespace distckpt::internal_format
