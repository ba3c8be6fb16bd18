// The HDF5 format's row of the format table: describing a file (through the reader
// program), checking names, and the sequential writer conversions use.
#include "format/hdf5/hdf5_io.h"

#include <string_view>

#include "base/strings.h"
#include "base/text.h"
#include "format/describe.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/hdf5/hdf5_lib.h"
#include "format/format.h"
#include "format/metadata_json.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

bool sniff_hdf5(std::string_view head) { return head.substr(0, 8) == std::string_view("\x89HDF\r\n\x1a\n", 8); }

Result<proto::Index> describe_hdf5(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(OpenedFile opened, open_single_file(fs, path));
  DISTCKPT_RETURN_IF_ERROR(check_single_file_head(hdf5_driver(), *opened.file, opened.size, path));
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, isolated_hdf5_index(path, internal_base::base_name(path)));
  // A file this version of distckpt wrote (its attribute records the writer's version,
  // or its datasets' CRC32C, or the footer is there) has both: the datasets' CRC32C (if
  // it has datasets) and the footer over the rest. Damage to one must not make it pass
  // for another writer's unchecked file.
  const bool ours = has_chunk_checksums(index) || !index.writer_version().empty() ||
                    has_hdf5_footer(*opened.file, opened.size);
  if (!ours) return index;
  if (!has_chunk_checksums(index) && index.tensors_size() > 0)
    return corruption("hdf5 '" + path + "': distckpt wrote it, but its 'distckpt' attribute, which records the "
                      "checksums, is missing or damaged");
  DISTCKPT_RETURN_IF_ERROR(check_hdf5_footer(*opened.file, opened.size, index, path));
  index.mutable_transforms()->set_checksum("crc32c");  // with no dataset: the structure checked
  return index;
}

Status check_hdf5_writable(const proto::Index& meta) {
  for (const auto& t : meta.tensors()) DISTCKPT_RETURN_IF_ERROR(check_hdf5_name(t.name()));
  return Status();
}

// An HDF5 file written by this process alone (serial driver), as a sequential writer:
// each append is written as the boxes of its element range (whole rows when the pieces
// are whole rows, as conversions read them).
class Hdf5SequentialWriter final : public SequentialWriter {
 public:
  Hdf5SequentialWriter(FileSystem& fs, std::string path, std::unique_ptr<Hdf5Writer> writer, proto::Index meta)
      : fs_(fs),
        path_(std::move(path)),
        writer_(std::move(writer)),
        meta_(std::move(meta)),
        progress_(meta_),
        crcs_(static_cast<std::size_t>(meta_.tensors_size()), internal_transform::kCrc32cInit) {}
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const proto::Tensor& t = meta_.tensors(tensor);
    const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
    if (n == 0) return Status();
    // Appends come in the dataset's byte order (Progress checks it).
    crcs_[static_cast<std::size_t>(tensor)] = internal_transform::crc32c_extend(crcs_[static_cast<std::size_t>(tensor)], data, n);
    if (at % item != 0 || n % item != 0)
      return internal_error("hdf5 writer: a piece of tensor '" + t.name() + "' is not whole elements");
    const Shape shape(t.global_shape().begin(), t.global_shape().end());
    const auto* p = static_cast<const char*>(data);
    for (const Box& box : internal_layout::flat_range_to_boxes(shape, static_cast<int64_t>(at / item),
                                                               static_cast<int64_t>((at + n) / item))) {
      DISTCKPT_RETURN_IF_ERROR(writer_->write(tensor, {{box, p}}));
      p += static_cast<std::size_t>(box.num_elements()) * item;
    }
    bytes_written_ += n;
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    for (uint32_t& crc : crcs_) crc = internal_transform::crc32c_finish(crc);
    writer_->set_crc32c(crcs_);
    DISTCKPT_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, writer_->data_offsets());
    DISTCKPT_RETURN_IF_ERROR(writer_->finish());
    writer_.reset();
    DISTCKPT_RETURN_IF_ERROR(append_hdf5_footer(fs_, path_, meta_, offsets, fsync));
    return meta_;
  }

 private:
  FileSystem& fs_;
  std::string path_;
  std::unique_ptr<Hdf5Writer> writer_;
  proto::Index meta_;
  Progress progress_;
  std::vector<uint32_t> crcs_;  // per tensor, of the bytes appended so far
};

Result<std::unique_ptr<SequentialWriter>> open_hdf5_writer(FileSystem& fs, const std::string& path,
                                                           const proto::Index& meta, const WriterOptions&) {
  DISTCKPT_ASSIGN_OR_RETURN(auto writer, Hdf5Writer::create(path, meta));
  return std::unique_ptr<SequentialWriter>(new Hdf5SequentialWriter(fs, path, std::move(writer), meta));
}

constexpr std::string_view kHdf5Extensions[] = {".h5", ".hdf5"};
}  // namespace

const FormatDriver& hdf5_driver() {
  static const FormatDriver kRow{
      .id = Format::kHdf5,
      .name = "hdf5",
      .extension = ".h5",
      .read_extensions = kHdf5Extensions,
      .single_file = true,
      .carries_encryption = false,
      .chunk_checksums = false,
      .sniff = sniff_hdf5,
      .describe = describe_hdf5,
      .check_writable = check_hdf5_writable,
      .add_format_info = nullptr,
      .open_writer = open_hdf5_writer,
  };
  return kRow;
}

}  // namespace distckpt::internal_format
