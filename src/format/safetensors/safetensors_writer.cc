// safetensors files written tensor by tensor (safetensors.h describes the format).
#include "format/safetensors/safetensors.h"
#include "format/sequential_writer.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

using internal_transform::crc32c_extend;
using internal_transform::crc32c_finish;
using internal_transform::kCrc32cInit;

class SafetensorsWriter final : public SequentialWriter {
 public:
  SafetensorsWriter(std::unique_ptr<WritableFile> file, proto::Index meta)
      : file_(std::move(file)), meta_(std::move(meta)), progress_(meta_) {
    for (auto& t : *meta_.mutable_tensors()) {
      auto* c = t.add_chunks();
      for (int64_t d : t.global_shape()) {
        c->add_offset(0);
        c->add_shape(d);
      }
      c->set_length(tensor_bytes(t));
    }
    layout_ = plan_safetensors(meta_);
    crcs_.assign(static_cast<std::size_t>(meta_.tensors_size()), kCrc32cInit);
  }
  // Readers (ours and the reference implementation) refuse headers over 100 MB.
  Status check_header_size() const {
    if (layout_.header_bytes > kSafetensorsMaxHeader)
      return invalid_argument("safetensors: the header would take " + std::to_string(layout_.header_bytes) +
                              " bytes, more than readers accept (100 MB): too many tensors or ranks for one file");
    return Status();
  }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const auto i = static_cast<std::size_t>(tensor);
    if (n == 0) return Status();
    crcs_[i] = crc32c_extend(crcs_[i], data, n);
    DISTCKPT_RETURN_IF_ERROR(file_->write_at(data, n, layout_.file_offset[i] + at));
    bytes_written_ += n;
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    for (int i = 0; i < meta_.tensors_size(); ++i)
      meta_.mutable_tensors(i)->mutable_chunks(0)->set_crc32c(crc32c_finish(crcs_[static_cast<std::size_t>(i)]));
    DISTCKPT_ASSIGN_OR_RETURN(std::string header, safetensors_header(meta_, layout_));
    DISTCKPT_RETURN_IF_ERROR(file_->write_at(header.data(), header.size(), 0));
    // An empty last tensor leaves nothing to extend the file to its full size.
    DISTCKPT_RETURN_IF_ERROR(file_->truncate(layout_.file_size));
    if (fsync) DISTCKPT_RETURN_IF_ERROR(file_->sync());
    DISTCKPT_RETURN_IF_ERROR(file_->close());
    return meta_;
  }

 private:
  std::unique_ptr<WritableFile> file_;
  proto::Index meta_;
  Progress progress_;
  SafetensorsLayout layout_;
  std::vector<uint32_t> crcs_;
};

}  // namespace

Result<std::unique_ptr<SequentialWriter>> open_safetensors_writer(FileSystem& fs, const std::string& path,
                                                                  const proto::Index& meta, const WriterOptions&) {
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.open_writable(path));
  auto w = std::make_unique<SafetensorsWriter>(std::move(file), meta);
  DISTCKPT_RETURN_IF_ERROR(w->check_header_size());
  return std::unique_ptr<SequentialWriter>(std::move(w));
}

}  // namespace distckpt::internal_format
