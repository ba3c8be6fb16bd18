#include "format/writers.h"

#include <map>

#include <set>

#include "format/hdf5_io.h"
#include "format/ms_ckpt.h"
#include "format/safetensors.h"
#include "storage/index_io.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

using internal_transform::crc32c_extend;
using internal_transform::crc32c_finish;
using internal_transform::kCrc32cInit;

uint64_t tensor_bytes(const proto::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.global_shape()) n *= d;
  return static_cast<uint64_t>(n) * dtype_size(*dtype_from_name(t.dtype()));
}

// Buffered sequential output: small pieces (record headers) are coalesced, large ones
// go straight to the file. Computes the zlib CRC-32 of everything written.
class Output {
 public:
  explicit Output(std::unique_ptr<WritableFile> file) : file_(std::move(file)) {}
  Status write(const void* data, std::size_t n) {
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
  Status write(const std::string& s) { return write(s.data(), s.size()); }
  Status flush() {
    if (buffer_.empty()) return Status();
    DISTCKPT_RETURN_IF_ERROR(file_->write_at(buffer_.data(), buffer_.size(), offset_));
    offset_ += buffer_.size();
    buffer_.clear();
    return Status();
  }
  Status close(bool fsync) {
    DISTCKPT_RETURN_IF_ERROR(flush());
    if (fsync) DISTCKPT_RETURN_IF_ERROR(file_->sync());
    return file_->close();
  }
  uint64_t position() const { return offset_ + buffer_.size(); }
  uint32_t crc32() const { return crc32_; }
  WritableFile& file() { return *file_; }

 private:
  static constexpr std::size_t kBuffer = 1 << 20;
  std::unique_ptr<WritableFile> file_;
  std::string buffer_;
  uint64_t offset_ = 0;
  uint32_t crc32_ = 0;
};

// Tracks the order of appends: tensors in order, each exactly its size.
class Progress {
 public:
  explicit Progress(const proto::Index& meta) : meta_(meta) {}
  // Checks that `n` more bytes of `tensor` are expected; returns the offset in it.
  Result<uint64_t> advance(int tensor, std::size_t n) {
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
  Status check_complete() const {
    uint64_t done = done_;
    for (int t = current_; t < meta_.tensors_size(); ++t, done = 0)
      if (done != tensor_bytes(meta_.tensors(t)))
        return internal_error("writer: tensor '" + meta_.tensors(t).name() + "' was not completely written");
    return Status();
  }

 private:
  const proto::Index& meta_;
  int current_ = 0;
  uint64_t done_ = 0;
};

class CkptWriter final : public SequentialWriter {
 public:
  CkptWriter(std::unique_ptr<WritableFile> file, proto::Index meta, bool footer)
      : out_(std::move(file)), meta_(std::move(meta)), progress_(meta_), footer_(footer) {}
  Status begin() { return out_.write(ckpt_meta_field(meta_)); }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const proto::Tensor& t = meta_.tensors(tensor);
    const DType dtype = *dtype_from_name(t.dtype());
    const std::size_t item = dtype_size(dtype);
    if (tensor != ranges_for_) {
      ranges_for_ = tensor;
      ranges_ = ckpt_record_ranges(Shape(t.global_shape().begin(), t.global_shape().end()), item);
    }
    const auto* p = static_cast<const char*>(data);
    if (tensor_bytes(t) == 0) {  // an empty tensor: one record without content
      Shape dims(t.global_shape().begin(), t.global_shape().end());
      return out_.write(ckpt_record_header(t.name(), dims, ms_type_name(dtype), 0));
    }
    while (n > 0) {
      // Start the record that begins at this byte, if one does.
      for (const auto& [b, e] : ranges_)
        if (static_cast<uint64_t>(b) * item == at && e > b) {
          Shape dims(t.global_shape().begin(), t.global_shape().end());
          if (dims.empty()) dims = {0};  // MindSpore's scalar
          DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_record_header(t.name(), dims, ms_type_name(dtype),
                                                                 static_cast<uint64_t>(e - b) * item)));
        }
      uint64_t record_end = at + n;
      for (const auto& [b, e] : ranges_)
        if (static_cast<uint64_t>(b) * item > at) record_end = std::min<uint64_t>(record_end, static_cast<uint64_t>(b) * item);
      const std::size_t piece = static_cast<std::size_t>(record_end - at);
      DISTCKPT_RETURN_IF_ERROR(out_.write(p, piece));
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
          type = "str";
          break;
      }
      DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_record(key, {0}, type, content)));
    }
    if (footer_) {
      DISTCKPT_RETURN_IF_ERROR(out_.flush());
      DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_footer(out_.crc32())));
    }
    DISTCKPT_RETURN_IF_ERROR(out_.close(fsync));
    return meta_;
  }

 private:
  Output out_;
  proto::Index meta_;
  Progress progress_;
  bool footer_;
  int ranges_for_ = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

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

// A native data file holding whole tensors back to back; finish() returns the index
// with one chunk per tensor (file 0 = this file), CRC32C included.
class NativeWriter final : public SequentialWriter {
 public:
  NativeWriter(std::unique_ptr<WritableFile> file, proto::Index meta, std::string file_name)
      : out_(std::move(file)), meta_(std::move(meta)), progress_(meta_), file_name_(std::move(file_name)) {
    crcs_.assign(static_cast<std::size_t>(meta_.tensors_size()), kCrc32cInit);
    offsets_.assign(static_cast<std::size_t>(meta_.tensors_size()), 0);
  }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const auto i = static_cast<std::size_t>(tensor);
    if (at == 0) offsets_[i] = out_.position();
    if (n == 0) return Status();
    crcs_[i] = crc32c_extend(crcs_[i], data, n);
    DISTCKPT_RETURN_IF_ERROR(out_.write(data, n));
    bytes_written_ += n;
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    const uint64_t size = out_.position();
    DISTCKPT_RETURN_IF_ERROR(out_.close(fsync));
    proto::Index index = meta_;
    auto* f = index.add_files();
    f->set_name(file_name_);
    f->set_size(size);
    for (int i = 0; i < index.tensors_size(); ++i) {
      proto::Tensor* t = index.mutable_tensors(i);
      auto* c = t->add_chunks();
      for (int64_t d : t->global_shape()) {
        c->add_offset(0);
        c->add_shape(d);
      }
      c->set_file_id(0);
      c->set_byte_offset(offsets_[static_cast<std::size_t>(i)]);
      c->set_length(tensor_bytes(*t));
      c->set_crc32c(crc32c_finish(crcs_[static_cast<std::size_t>(i)]));
    }
    return index;
  }

 private:
  Output out_;
  proto::Index meta_;
  Progress progress_;
  std::string file_name_;
  std::vector<uint32_t> crcs_;
  std::vector<uint64_t> offsets_;
};

}  // namespace

Status check_writable(Format format, const proto::Index& meta) {
  std::set<std::string> names;
  for (const auto& t : meta.tensors()) {
    names.insert(t.name());
    if (format == Format::kSafetensors && t.name() == "__metadata__")
      return invalid_argument("tensor '__metadata__' cannot be stored in safetensors (reserved key)");
    if (format == Format::kHdf5) DISTCKPT_RETURN_IF_ERROR(check_hdf5_name(t.name()));
  }
  if (format == Format::kCkpt)
    for (const auto& [key, v] : meta.info())
      if (names.count(key))
        return invalid_argument("info value '" + key + "' has the name of a tensor: a .ckpt stores both as records");
  return Status();
}

Result<std::unique_ptr<SequentialWriter>> make_sequential_writer(Format format, FileSystem& fs,
                                                                 const std::string& path, const proto::Index& meta,
                                                                 bool ckpt_crc_footer) {
  DISTCKPT_RETURN_IF_ERROR(check_writable(format, meta));
  if (format == Format::kHdf5) return unsupported("hdf5 files are written by Hdf5Writer, not sequentially");
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.open_writable(path));
  if (format == Format::kCkpt) {
    auto w = std::make_unique<CkptWriter>(std::move(file), meta, ckpt_crc_footer);
    DISTCKPT_RETURN_IF_ERROR(w->begin());
    return std::unique_ptr<SequentialWriter>(std::move(w));
  }
  if (format == Format::kSafetensors) {
    auto w = std::make_unique<SafetensorsWriter>(std::move(file), meta);
    DISTCKPT_RETURN_IF_ERROR(w->check_header_size());
    return std::unique_ptr<SequentialWriter>(std::move(w));
  }
  const auto slash = path.find_last_of('/');
  return std::unique_ptr<SequentialWriter>(
      new NativeWriter(std::move(file), meta, slash == std::string::npos ? path : path.substr(slash + 1)));
}

}  // namespace distckpt::internal_format
