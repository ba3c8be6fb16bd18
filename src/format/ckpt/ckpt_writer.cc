// MindSpore .ckpt files written record by record (ms_ckpt.h describes the format).
#include <map>
#include <optional>

#include "format/ckpt/framed_file.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

class CkptWriter final : public SequentialWriter {
 public:
  CkptWriter(std::unique_ptr<WritableFile> file, proto::Index meta, bool footer, bool describe)
      : out_(std::move(file)), meta_(std::move(meta)), progress_(meta_), footer_(footer), describe_(describe) {}
  // The metadata field first, saying what the file will hold (CkptLayout): one record
  // per split of each tensor (an empty one has one), one per info value, the footer.
  Status begin() {
    uint64_t records = static_cast<uint64_t>(meta_.info_size());
    for (const auto& t : meta_.tensors()) {
      const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
      records += std::max<uint64_t>(1, ckpt_record_ranges(Shape(t.global_shape().begin(), t.global_shape().end()), item).size());
    }
    meta_.mutable_ckpt_layout()->set_records(records);
    meta_.mutable_ckpt_layout()->set_footer(footer_);
    meta_.mutable_ckpt_layout()->set_checks(true);
    return put(ckpt_meta_field(meta_));
  }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const proto::Tensor& t = meta_.tensors(tensor);
    const DType dtype = *dtype_from_name(t.dtype());
    const std::size_t item = dtype_size(dtype);
    if (tensor != ranges_for_) {
      ranges_for_ = tensor;
      ranges_ = ckpt_record_ranges(Shape(t.global_shape().begin(), t.global_shape().end()), item);
      plan_described(t, item);
    }
    const auto* p = static_cast<const char*>(data);
    if (tensor_bytes(t) == 0) {  // an empty tensor: one record without content
      Shape dims(t.global_shape().begin(), t.global_shape().end());
      return put(ckpt_record_header(t.name(), dims, ms_type_name(dtype), 0));
    }
    while (n > 0) {
      // Start the record that begins at this byte, if one does.
      for (const auto& [b, e] : ranges_)
        if (static_cast<uint64_t>(b) * item == at && e > b) {
          Shape dims(t.global_shape().begin(), t.global_shape().end());
          if (dims.empty()) dims = {0};  // MindSpore's scalar
          DISTCKPT_RETURN_IF_ERROR(put(ckpt_record_header(t.name(), dims, ms_type_name(dtype),
                                                                 static_cast<uint64_t>(e - b) * item)));
        }
      uint64_t record_end = at + n;
      for (const auto& [b, e] : ranges_)
        if (static_cast<uint64_t>(b) * item > at) record_end = std::min<uint64_t>(record_end, static_cast<uint64_t>(b) * item);
      {
        if (described_next_ >= described_.size())
          return internal_error("writer: more bytes than the boxes of '" + t.name() + "'");
        const DescribedUnit& u = described_[described_next_];
        if (at == u.begin) {
          described_at_ = out_.position();
          described_crc_ = internal_transform::kCrc32cInit;
        }
        record_end = std::min(record_end, u.end);
      }
      const std::size_t piece = static_cast<std::size_t>(record_end - at);
      DISTCKPT_RETURN_IF_ERROR(out_.write(p, piece));
      {
        described_crc_ = internal_transform::crc32c_extend(described_crc_, p, piece);
        const DescribedUnit& u = described_[described_next_];
        if (at + piece == u.end) checks_msg_.add_chunk_crc32c(internal_transform::crc32c_finish(described_crc_));
        if (at + piece == u.end && describe_) {
          proto::Chunk* c = meta_.mutable_tensors(tensor)->add_chunks();
          for (std::size_t d = 0; d < u.box.offset.size(); ++d) {
            c->add_offset(u.box.offset[d]);
            c->add_shape(u.box.shape[d]);
          }
          c->set_byte_offset(described_at_);
          c->set_length(u.end - u.begin);
          c->set_crc32c(internal_transform::crc32c_finish(described_crc_));
        }
        if (at + piece == u.end) ++described_next_;
      }
      bytes_written_ += piece;
      p += piece;
      at += piece;
      n -= piece;
    }
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    // Sorted by key: protobuf's map order is random per instance (reproducible files).
    const std::map<std::string, proto::InfoValue> sorted(meta_.info().begin(), meta_.info().end());
    for (const auto& [key, v] : sorted) {
      std::string content, type;
      switch (v.value_case()) {
        case proto::InfoValue::kIntValue: {
          const int64_t x = v.int_value();
          content.assign(reinterpret_cast<const char*>(&x), 8);
          type = "Int64";
          break;
        }
        case proto::InfoValue::kFloatValue: {
          const double x = v.float_value();
          content.assign(reinterpret_cast<const char*>(&x), 8);
          type = "Float64";
          break;
        }
        case proto::InfoValue::kBoolValue:
          content.assign(1, v.bool_value() ? '\1' : '\0');
          type = "Bool";
          break;
        default:
          content = utf8_to_utf32le(v.string_value());
          // numpy's '' is one NUL code unit (np.array('').tobytes()); MindSpore's reader
          // refuses a 0-byte str record (numpy cannot make a U0 array).
          if (content.empty()) content.assign(4, '\0');
          type = "str";
          break;
      }
      DISTCKPT_RETURN_IF_ERROR(put(ckpt_record(key, {0}, type, content)));
    }
    // Every chunk's CRC32C, so that a file without MindSpore's footer is checked too.
    {
      checks_msg_.set_structure_crc32c(internal_transform::crc32c_finish(structure_crc_));
      DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_checks_field(checks_msg_)));
    }
    const uint64_t data_end = out_.position();
    const uint32_t data_crc = out_.crc32();
    if (footer_) {
      DISTCKPT_RETURN_IF_ERROR(out_.flush());
      DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_footer(out_.crc32())));
    }
    if (describe_) {
      proto::File* f = meta_.add_files();
      f->set_size(out_.position());
      f->set_crc32_covered(data_end);
      f->set_crc32(data_crc);
    }
    DISTCKPT_RETURN_IF_ERROR(out_.close(fsync));
    return meta_;
  }

 private:
  Output out_;
  proto::Index meta_;
  Progress progress_;
  // The current tensor's record boxes, as byte ranges of the tensor (each a chunk: its
  // CRC32C goes to the checks field and, with describe_chunks, the index).
  struct DescribedUnit {
    uint64_t begin = 0, end = 0;
    Box box;
  };
  void plan_described(const proto::Tensor& t, std::size_t item) {
    described_.clear();
    described_next_ = 0;
    const Shape shape(t.global_shape().begin(), t.global_shape().end());
    if (tensor_bytes(t) == 0) return;
    uint64_t at = 0;
    for (const auto& [b, e] : ranges_)
      for (const Box& box : internal_layout::flat_range_to_boxes(shape, b, e)) {
        const uint64_t bytes = static_cast<uint64_t>(box.num_elements()) * item;
        described_.push_back(DescribedUnit{at, at + bytes, box});
        at += bytes;
      }
  }

  bool footer_;
  bool describe_;  // the chunks, with their CRC32C, into the returned index (a per-rank set's)
  proto::CkptChecks checks_msg_;
  uint32_t structure_crc_ = internal_transform::kCrc32cInit;  // every byte but tensor contents
  // Writes bytes of the file's structure (all but tensor contents): into the structure CRC.
  Status put(const std::string& bytes) {
    structure_crc_ = internal_transform::crc32c_extend(structure_crc_, bytes.data(), bytes.size());
    return out_.write(bytes);
  }
  std::vector<DescribedUnit> described_;
  std::size_t described_next_ = 0;
  uint64_t described_at_ = 0;
  uint32_t described_crc_ = 0;
  int ranges_for_ = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

}  // namespace

Result<std::unique_ptr<SequentialWriter>> open_ckpt_writer(FileSystem& fs, const std::string& path,
                                                           const proto::Index& meta, const WriterOptions& options) {
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.open_writable(path));
  // Encrypted: the whole file, in MindSpore's framing (framed_file.h). MindSpore does not
  // combine its CRC footer with encryption (save_checkpoint refuses crc_check with an
  // enc_key), so an encrypted file has none: its checks are the per-record CRC32Cs and,
  // for AES-GCM, the blocks' tags.
  const bool encrypted = options.encryption != nullptr && options.encryption->enabled();
  if (encrypted) {
    DISTCKPT_ASSIGN_OR_RETURN(file, framed_writable(std::move(file), options.encryption->mode, *options.encryption->key));
  }
  auto w = std::make_unique<CkptWriter>(std::move(file), meta, options.ckpt_crc_footer && !encrypted,
                                        options.describe_chunks);
  DISTCKPT_RETURN_IF_ERROR(w->begin());
  return std::unique_ptr<SequentialWriter>(std::move(w));
}

}  // namespace distckpt::internal_format
