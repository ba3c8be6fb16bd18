#include "format/sequential_writer.h"

#include "format/format.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

Status Output::write(const void* data, std::size_t n) {
  crc32_ = internal_transform::crc32_zlib(crc32_, data, n);
  if (buffer_.size() + n <= kBuffer) {
    buffer_.append(static_cast<const char*>(data), n);
    return Status();
  }
  DISTCKPT_RETURN_IF_ERROR(flush());
  DISTCKPT_RETURN_IF_ERROR(file_->write_at(data, n, offset_));
  offset_ += n;
  return Status();
}

Status Output::flush() {
  if (buffer_.empty()) return Status();
  DISTCKPT_RETURN_IF_ERROR(file_->write_at(buffer_.data(), buffer_.size(), offset_));
  offset_ += buffer_.size();
  buffer_.clear();
  return Status();
}

Status Output::close(bool fsync) {
  DISTCKPT_RETURN_IF_ERROR(flush());
  if (fsync) DISTCKPT_RETURN_IF_ERROR(file_->sync());
  return file_->close();
}

Result<uint64_t> Progress::advance(int tensor, std::size_t n) {
  if (tensor < current_ || tensor >= meta_.tensors_size())
    return internal_error("writer: tensor " + std::to_string(tensor) + " arrived out of order");
  for (; current_ < tensor; ++current_, done_ = 0)
    if (done_ != tensor_bytes(meta_.tensors(current_)))
      return internal_error("writer: tensor '" + meta_.tensors(current_).name() + "' is incomplete");
  if (done_ + n > tensor_bytes(meta_.tensors(tensor)))
    return internal_error("writer: more bytes than tensor '" + meta_.tensors(tensor).name() + "' holds");
  const uint64_t at = done_;
  done_ += n;
  return at;
}

Status Progress::check_complete() const {
  uint64_t done = done_;
  for (int t = current_; t < meta_.tensors_size(); ++t, done = 0)
    if (done != tensor_bytes(meta_.tensors(t)))
      return internal_error("writer: tensor '" + meta_.tensors(t).name() + "' was not completely written");
  return Status();
}

Result<std::unique_ptr<SequentialWriter>> make_sequential_writer(Format format, FileSystem& fs,
                                                                 const std::string& path, const proto::Index& meta,
                                                                 const WriterOptions& options) {
  DISTCKPT_RETURN_IF_ERROR(check_writable(format, meta));
  if (options.cipher != nullptr || (options.encryption != nullptr && options.encryption->enabled()))
    DISTCKPT_RETURN_IF_ERROR(encryption_refused(format));
  return driver(format).open_writer(fs, path, meta, options);
}

}  // namespace distckpt::internal_format
