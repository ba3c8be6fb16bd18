// The native format's row of the format table, and its sequential writer (gathered
// native saves and conversions to native: whole tensors in one data file).
#include <optional>

#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

using internal_transform::crc32c_extend;
using internal_transform::crc32c_finish;
using internal_transform::kCrc32cInit;

// A native data file holding whole tensors, each at the next multiple of 64 bytes; finish() returns the index
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
      DISTCKPT_RETURN_IF_ERROR(start_chunk(i));
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
          DISTCKPT_RETURN_IF_ERROR(start_chunk(static_cast<std::size_t>(i)));
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
  // Tensor `i` starts at the next chunk_start; the gap is zeros.
  Status start_chunk(std::size_t i) {
    const uint64_t at = out_.position();
    DISTCKPT_RETURN_IF_ERROR(out_.write(kGapZeros, static_cast<std::size_t>(chunk_start(at) - at)));
    offsets_[i] = chunk_start(at);
    return Status();
  }
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

Result<std::unique_ptr<SequentialWriter>> open_native_writer(FileSystem& fs, const std::string& dir,
                                                             const proto::Index& meta, const WriterOptions& options) {
  const std::string file_name = data_file_name(options.writer_rank);
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.open_writable(dir + "/" + file_name));
  return std::unique_ptr<SequentialWriter>(new NativeWriter(std::move(file), meta, file_name, options.cipher));
}

}  // namespace

const FormatDriver& native_driver() {
  static const FormatDriver kRow{
      .id = Format::kNative,
      .name = "native",
      .extension = "",
      .read_extensions = {},
      .single_file = false,
      .carries_encryption = true,
      .chunk_checksums = true,
      .sniff = nullptr,
      .describe = read_index,
      .check_writable = nullptr,
      .add_format_info = nullptr,
      .open_writer = open_native_writer,
  };
  return kRow;
}

}  // namespace distckpt::internal_format
