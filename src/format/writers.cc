#include "format/writers.h"

#include <map>
#include <optional>
#include <set>

#include "format/hdf5/hdf5_io.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/safetensors/safetensors.h"
#include "layout/region.h"
#include "format/native/index_io.h"
#include "transform/cipher.h"
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
  CkptWriter(std::unique_ptr<WritableFile> file, proto::Index meta, bool footer,
             const internal_transform::CheckpointCipher* cipher)
      : out_(std::move(file)), meta_(std::move(meta)), progress_(meta_), footer_(footer), cipher_(cipher) {
    if (cipher_ != nullptr) {
      encryption_.set_mode(std::string(encryption_mode_name(cipher_->mode())));
      encryption_.set_algorithm(cipher_->algorithm());
      encryption_.set_salt(cipher_->salt());
    }
  }
  Status begin() { return out_.write(ckpt_meta_field(meta_)); }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const proto::Tensor& t = meta_.tensors(tensor);
    const DType dtype = *dtype_from_name(t.dtype());
    const std::size_t item = dtype_size(dtype);
    if (tensor != ranges_for_) {
      if (cipher_ != nullptr) DISTCKPT_RETURN_IF_ERROR(seal_empty_before(tensor));
      ranges_for_ = tensor;
      ranges_ = ckpt_record_ranges(Shape(t.global_shape().begin(), t.global_shape().end()), item);
      if (cipher_ != nullptr) plan_units(t, item);
    }
    if (cipher_ != nullptr) return append_sealed(tensor, at, data, n);
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
    if (cipher_ != nullptr) {
      DISTCKPT_RETURN_IF_ERROR(seal_empty_before(meta_.tensors_size()));
      // The seal: the metadata (names, dtypes, shapes, layouts, step, info values) and
      // every chunk's nonce and tag, authenticated with the index key.
      DISTCKPT_ASSIGN_OR_RETURN(std::string nonce,
                                internal_transform::CheckpointCipher::random_bytes(cipher_->nonce_bytes()));
      std::string sealed, tag;
      DISTCKPT_RETURN_IF_ERROR(cipher_->seal_buffer(
          ckpt_sealed_aad(internal_storage::serialize_deterministic(meta_), encryption_), kCkptSealText, nonce,
          &sealed, &tag));
      encryption_.set_seal_nonce(nonce);
      encryption_.set_sealed(sealed);
      encryption_.set_seal_tag(tag);
      DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_encryption_field(encryption_)));
    }
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
  // Encrypted: each record's boxes are sealed one after another (ms_ckpt.h's reader
  // expects exactly this). A unit is one box: its bytes [begin, end) in the tensor, and
  // whether a record starts with it (then the record's stored bytes).
  struct Unit {
    uint64_t begin = 0, end = 0;
    bool record_start = false;
    uint64_t record_stored = 0;
  };
  void plan_units(const proto::Tensor& t, std::size_t item) {
    units_.clear();
    unit_ = 0;
    chunk_ = 0;
    const Shape shape(t.global_shape().begin(), t.global_shape().end());
    if (tensor_bytes(t) == 0) {
      units_.push_back(Unit{0, 0, true, cipher_->stored_length(0)});
      return;
    }
    for (const auto& [b, e] : ranges_) {
      const std::size_t first = units_.size();
      uint64_t stored = 0;
      for (const Box& box : internal_layout::flat_range_to_boxes(shape, b, e)) {
        const uint64_t begin = units_.empty() ? 0 : units_.back().end;
        const uint64_t bytes = static_cast<uint64_t>(box.num_elements()) * item;
        units_.push_back(Unit{begin, begin + bytes, false, 0});
        stored += cipher_->stored_length(bytes);
      }
      units_[first].record_start = true;
      units_[first].record_stored = stored;
    }
  }
  Status append_sealed(int tensor, uint64_t at, const void* data, std::size_t n) {
    const proto::Tensor& t = meta_.tensors(tensor);
    const auto* p = static_cast<const char*>(data);
    do {
      if (unit_ >= units_.size()) return internal_error("writer: more bytes than the records of '" + t.name() + "'");
      const Unit& u = units_[unit_];
      if (at == u.begin && !sealer_) {
        if (u.record_start) {
          Shape dims(t.global_shape().begin(), t.global_shape().end());
          if (dims.empty()) dims = {0};  // MindSpore's scalar
          DISTCKPT_RETURN_IF_ERROR(out_.write(ckpt_record_header(t.name(), dims, kCkptEncryptedType, u.record_stored)));
        }
        const std::string nonce = cipher_->chunk_nonce(static_cast<uint32_t>(tensor), chunk_);
        auto sealer = cipher_->begin_seal(nonce, internal_transform::chunk_aad(t.name(), chunk_, "", out_.position(),
                                                                              cipher_->stored_length(u.end - u.begin),
                                                                              u.end - u.begin));
        if (!sealer.ok()) return sealer.status();
        sealer_.emplace(std::move(*sealer));
        encryption_.add_nonce(nonce);
        bounce_.resize(kPiece + 32);
      }
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>({n, u.end - at, kPiece}));
      std::size_t out = 0;
      if (take > 0) {
        DISTCKPT_RETURN_IF_ERROR(sealer_->update(p, take, bounce_.data(), &out));
        DISTCKPT_RETURN_IF_ERROR(out_.write(bounce_.data(), out));
        bytes_written_ += out;
      }
      p += take;
      at += take;
      n -= take;
      if (at == u.end) {
        std::string tag;
        DISTCKPT_RETURN_IF_ERROR(sealer_->finish(bounce_.data(), &out, &tag));
        DISTCKPT_RETURN_IF_ERROR(out_.write(bounce_.data(), out));
        bytes_written_ += out;
        encryption_.add_tag(tag);
        sealer_.reset();
        ++unit_;
        ++chunk_;
      }
    } while (n > 0);
    return Status();
  }
  // Empty tensors the caller never appended, before tensor `next`: sealed now, so the
  // file's records and chunks stay in the tensors' order.
  Status seal_empty_before(int next) {
    for (int t = ranges_for_ < 0 ? 0 : ranges_for_ + 1; t < next; ++t) {
      const proto::Tensor& tensor = meta_.tensors(t);
      if (tensor_bytes(tensor) != 0) return internal_error("writer: tensor '" + tensor.name() + "' was skipped");
      ranges_for_ = t;
      ranges_ = ckpt_record_ranges(Shape(tensor.global_shape().begin(), tensor.global_shape().end()),
                                   dtype_size(*dtype_from_name(tensor.dtype())));
      plan_units(tensor, dtype_size(*dtype_from_name(tensor.dtype())));
      DISTCKPT_RETURN_IF_ERROR(append_sealed(t, 0, nullptr, 0));
    }
    return Status();
  }

  static constexpr uint64_t kPiece = 4 << 20;
  bool footer_;
  int ranges_for_ = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  const internal_transform::CheckpointCipher* cipher_;
  proto::CkptEncryption encryption_;
  std::vector<Unit> units_;
  std::size_t unit_ = 0;
  uint64_t chunk_ = 0;
  std::optional<internal_transform::CheckpointCipher::Sealer> sealer_;
  std::vector<char> bounce_;
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
// with one chunk per tensor (file 0 = this file), CRC32C included. With a cipher, each
// tensor is one encrypted chunk (nonce and tag in the index; CBC pads its end).
class NativeWriter final : public SequentialWriter {
 public:
  NativeWriter(std::unique_ptr<WritableFile> file, proto::Index meta, std::string file_name,
               const internal_transform::CheckpointCipher* cipher)
      : out_(std::move(file)), meta_(std::move(meta)), progress_(meta_), file_name_(std::move(file_name)),
        cipher_(cipher) {
    const auto n = static_cast<std::size_t>(meta_.tensors_size());
    crcs_.assign(n, kCrc32cInit);
    offsets_.assign(n, 0);
    tags_.assign(n, std::string());
  }
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const auto i = static_cast<std::size_t>(tensor);
    if (cipher_ != nullptr && !tags_[i].empty()) {  // sealed already: an empty tensor appended twice
      if (n == 0) return Status();
      return internal_error("writer: tensor '" + meta_.tensors(tensor).name() + "' was already complete");
    }
    if (at == 0) {
      offsets_[i] = out_.position();
      if (cipher_ != nullptr) DISTCKPT_RETURN_IF_ERROR(begin_seal(tensor));
    }
    if (cipher_ == nullptr) {
      if (n == 0) return Status();
      DISTCKPT_RETURN_IF_ERROR(emit(i, data, n));
      bytes_written_ += n;
      return Status();
    }
    const auto* p = static_cast<const char*>(data);
    for (std::size_t done = 0; done < n;) {
      const std::size_t piece = std::min<std::size_t>(kPiece, n - done);
      std::size_t out = 0;
      DISTCKPT_RETURN_IF_ERROR(sealer_->update(p + done, piece, bounce_.data(), &out));
      DISTCKPT_RETURN_IF_ERROR(emit(i, bounce_.data(), out));
      done += piece;
    }
    if (at + n == tensor_bytes(meta_.tensors(tensor))) DISTCKPT_RETURN_IF_ERROR(end_seal(i));
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    if (cipher_ != nullptr)  // empty tensors no one appended: an empty chunk each
      for (int i = 0; i < meta_.tensors_size(); ++i)
        if (tags_[static_cast<std::size_t>(i)].empty()) {
          offsets_[static_cast<std::size_t>(i)] = out_.position();
          DISTCKPT_RETURN_IF_ERROR(begin_seal(i));
          DISTCKPT_RETURN_IF_ERROR(end_seal(static_cast<std::size_t>(i)));
        }
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
      c->set_length(cipher_ != nullptr ? cipher_->stored_length(tensor_bytes(*t)) : tensor_bytes(*t));
      c->set_crc32c(crc32c_finish(crcs_[static_cast<std::size_t>(i)]));
      if (cipher_ != nullptr) {
        c->set_nonce(cipher_->chunk_nonce(static_cast<uint32_t>(i), 0));
        c->set_tag(tags_[static_cast<std::size_t>(i)]);
      }
    }
    return index;
  }

 private:
  static constexpr std::size_t kPiece = 4 << 20;
  Status emit(std::size_t i, const void* data, std::size_t n) {
    crcs_[i] = crc32c_extend(crcs_[i], data, n);
    return out_.write(data, n);
  }
  Status begin_seal(int tensor) {
    const proto::Tensor& t = meta_.tensors(tensor);
    const uint64_t plain = tensor_bytes(t);
    bounce_.resize(kPiece + 32);
    auto sealer = cipher_->begin_seal(
        cipher_->chunk_nonce(static_cast<uint32_t>(tensor), 0),
        internal_transform::chunk_aad(t.name(), 0, file_name_, out_.position(), cipher_->stored_length(plain), plain));
    if (!sealer.ok()) return sealer.status();
    sealer_.emplace(std::move(*sealer));
    return Status();
  }
  Status end_seal(std::size_t i) {
    std::size_t out = 0;
    DISTCKPT_RETURN_IF_ERROR(sealer_->finish(bounce_.data(), &out, &tags_[i]));
    DISTCKPT_RETURN_IF_ERROR(emit(i, bounce_.data(), out));
    bytes_written_ += cipher_->stored_length(tensor_bytes(meta_.tensors(static_cast<int>(i))));
    sealer_.reset();
    return Status();
  }

  Output out_;
  proto::Index meta_;
  Progress progress_;
  std::string file_name_;
  const internal_transform::CheckpointCipher* cipher_;
  std::optional<internal_transform::CheckpointCipher::Sealer> sealer_;
  std::vector<char> bounce_;
  std::vector<uint32_t> crcs_;
  std::vector<uint64_t> offsets_;
  std::vector<std::string> tags_;
};

}  // namespace

Status encryption_refused(Format format) {
  if (format == Format::kNative || format == Format::kCkpt) return Status();
  return invalid_argument(std::string(format_name(format)) +
                          " files cannot carry encryption (the format has no place for nonces and tags): use the "
                          "native format");
}

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
                                                                 bool ckpt_crc_footer,
                                                                 const internal_transform::CheckpointCipher* cipher) {
  DISTCKPT_RETURN_IF_ERROR(check_writable(format, meta));
  if (cipher != nullptr && format != Format::kNative && format != Format::kCkpt) return encryption_refused(format);
  if (format == Format::kHdf5) return unsupported("hdf5 files are written by Hdf5Writer, not sequentially");
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.open_writable(path));
  if (format == Format::kCkpt) {
    auto w = std::make_unique<CkptWriter>(std::move(file), meta, ckpt_crc_footer, cipher);
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
      new NativeWriter(std::move(file), meta, slash == std::string::npos ? path : path.substr(slash + 1), cipher));
}

}  // namespace distckpt::internal_format
