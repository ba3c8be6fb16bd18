#include "format/ckpt/framed_file.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "format/format.h"
#include "transform/ms_framing.h"

namespace distckpt::internal_format {

using internal_transform::kMsMaxBlockPlain;
using internal_transform::MsBlockCipher;
using internal_transform::MsBlockHeader;

namespace {

// ---- writing ----

class FramedWritable final : public WritableFile {
 public:
  FramedWritable(std::unique_ptr<WritableFile> base, MsBlockCipher cipher)
      : base_(std::move(base)), cipher_(std::move(cipher)) {}

  Status write_at(const void* data, std::size_t n, uint64_t offset) override {
    if (offset != plain_written_)
      return internal_error("encrypted .ckpt: a write at byte " + std::to_string(offset) + ", not at the end (" +
                            std::to_string(plain_written_) + ")");
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      if (!open_) DISTCKPT_RETURN_IF_ERROR(begin_block());
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>({n, kMsMaxBlockPlain - block_plain_, kPiece}));
      std::size_t produced = 0;
      DISTCKPT_RETURN_IF_ERROR(cipher_.update(p, take, scratch_.data(), &produced));
      DISTCKPT_RETURN_IF_ERROR(put(scratch_.data(), produced));
      block_plain_ += take;
      plain_written_ += take;
      p += take;
      n -= take;
      if (block_plain_ == kMsMaxBlockPlain) DISTCKPT_RETURN_IF_ERROR(end_block());
    }
    return Status();
  }
  Status truncate(uint64_t) override { return internal_error("an encrypted .ckpt is never truncated"); }
  Status sync() override {
    if (open_) DISTCKPT_RETURN_IF_ERROR(end_block());
    return base_->sync();
  }
  Status close() override {
    if (open_) DISTCKPT_RETURN_IF_ERROR(end_block());
    return base_->close();
  }

 private:
  static constexpr std::size_t kPiece = std::size_t{4} << 20;
  Status begin_block() {
    DISTCKPT_RETURN_IF_ERROR(cipher_.begin(&iv_));
    scratch_.resize(kPiece + 16);
    header_at_ = file_written_;
    file_written_ += internal_transform::ms_header_bytes(cipher_.mode());
    block_plain_ = 0;
    cipher_len_ = 0;
    open_ = true;
    return Status();
  }
  Status put(const char* p, std::size_t n) {
    if (n == 0) return Status();
    DISTCKPT_RETURN_IF_ERROR(base_->write_at(p, n, file_written_));
    file_written_ += n;
    cipher_len_ += n;
    return Status();
  }
  // The header goes in last, at the place begin_block left for it: only then are the
  // cipher's length and the GCM tag known.
  Status end_block() {
    std::size_t produced = 0;
    std::string tag;
    DISTCKPT_RETURN_IF_ERROR(cipher_.finish(scratch_.data(), &produced, &tag));
    DISTCKPT_RETURN_IF_ERROR(put(scratch_.data(), produced));
    MsBlockHeader h;
    h.mode = cipher_.mode();
    h.tag = tag;
    h.iv = iv_;
    h.cipher_len = static_cast<uint32_t>(cipher_len_);
    const std::string header = internal_transform::ms_block_header(h);
    DISTCKPT_RETURN_IF_ERROR(base_->write_at(header.data(), header.size(), header_at_));
    open_ = false;
    return Status();
  }

  std::unique_ptr<WritableFile> base_;
  MsBlockCipher cipher_;
  std::vector<char> scratch_;
  std::string iv_;
  bool open_ = false;
  uint64_t plain_written_ = 0, file_written_ = 0, header_at_ = 0, block_plain_ = 0, cipher_len_ = 0;
};

// ---- reading ----

struct Block {
  MsBlockHeader header;
  uint64_t cipher_at = 0;  // in the file
  uint64_t plain_at = 0;   // in the plaintext
  uint64_t plain_len = 0;
};

class FramedReadable final : public ReadableFile {
 public:
  FramedReadable(std::unique_ptr<ReadableFile> base, MsBlockCipher cipher, std::vector<Block> blocks,
                 uint64_t plain_size, uint64_t stored_size, std::string path)
      : base_(std::move(base)),
        cipher_(std::move(cipher)),
        blocks_(std::move(blocks)),
        plain_size_(plain_size),
        stored_size_(stored_size),
        path_(std::move(path)) {}

  Status read_at(void* data, std::size_t n, uint64_t offset) const override {
    if (offset > plain_size_ || n > plain_size_ - offset)
      return corruption("'" + path_ + "': a read of " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                        " past the end of its plaintext (" + std::to_string(plain_size_) + " bytes)");
    char* out = static_cast<char*>(data);
    // The first block holding `offset`: the last one starting at or before it.
    auto it = std::upper_bound(blocks_.begin(), blocks_.end(), offset,
                               [](uint64_t o, const Block& b) { return o < b.plain_at; });
    std::size_t b = static_cast<std::size_t>(it - blocks_.begin()) - 1;
    std::lock_guard<std::mutex> lock(mu_);
    while (n > 0) {
      DISTCKPT_RETURN_IF_ERROR(load_block(b));
      const Block& block = blocks_[b];
      const uint64_t in_block = offset - block.plain_at;
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, block.plain_len - in_block));
      std::memcpy(out, plain_.data() + in_block, take);
      out += take;
      offset += take;
      n -= take;
      ++b;
    }
    return Status();
  }
  Result<uint64_t> size() const override { return plain_size_; }
  FramingInfo info() const { return {cipher_.mode(), cipher_.algorithm(), blocks_.size(), stored_size_}; }

 private:
  // Decrypts block `b` whole into plain_ (the one block kept), unless it is there.
  Status load_block(std::size_t b) const {
    if (cached_ == b) return Status();
    Status st = decrypt_block(b);
    // GCM: a wrong key fails on every block. A block failing where another authenticated
    // with this key was modified or damaged (kCorruption: the manager's resume falls back
    // past damage, never past a wrong key).
    if (st.code() == StatusCode::kAuthFailed && cipher_.mode() == EncryptionMode::kAesGcm && b != 0 && !key_proven_)
      (void)decrypt_block(0);  // proves the key, or fails alike
    if (st.code() == StatusCode::kAuthFailed && key_proven_)
      return corruption(st.message() + " (other blocks authenticate with this key: the file was modified or damaged)");
    return st;
  }
  Status decrypt_block(std::size_t b) const {
    cached_ = kNone;
    const Block& block = blocks_[b];
    plain_.resize(std::max<std::size_t>(plain_.size(), block.header.cipher_len));
    DISTCKPT_RETURN_IF_ERROR(base_->read_at(plain_.data(), block.header.cipher_len, block.cipher_at));
    uint64_t got = 0;
    DISTCKPT_RETURN_IF_ERROR(cipher_.decrypt(block.header, plain_.data(), plain_.data(), &got,
                                             "'" + path_ + "' block " + std::to_string(b)));
    if (cipher_.mode() == EncryptionMode::kAesGcm) key_proven_ = true;
    if (got != block.plain_len)
      return corruption("'" + path_ + "' block " + std::to_string(b) + ": " + std::to_string(got) +
                        " bytes of plaintext, its padding said " + std::to_string(block.plain_len));
    cached_ = b;
    return Status();
  }

  static constexpr std::size_t kNone = ~std::size_t{0};
  std::unique_ptr<ReadableFile> base_;
  MsBlockCipher cipher_;
  std::vector<Block> blocks_;
  uint64_t plain_size_, stored_size_;
  std::string path_;
  mutable std::mutex mu_;
  mutable std::vector<char> plain_;
  mutable std::size_t cached_ = kNone;
  mutable bool key_proven_ = false;  // a GCM block authenticated with this key
};

// The block table of a framed file: every header read and checked and, with a cipher
// (CBC), every block's plaintext length from its padding (without one, the cipher's).
Result<std::vector<Block>> read_block_table(const ReadableFile& file, uint64_t size, EncryptionMode mode,
                                            const MsBlockCipher* cipher, const std::string& where) {
  const std::size_t header_bytes = internal_transform::ms_header_bytes(mode);
  std::vector<Block> blocks;
  uint64_t at = 0, plain = 0;
  std::string header(header_bytes, '\0'), last32(32, '\0');
  while (at < size) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(header_bytes, size - at));
    DISTCKPT_RETURN_IF_ERROR(file.read_at(header.data(), n, at));
    DISTCKPT_ASSIGN_OR_RETURN(MsBlockHeader h, internal_transform::parse_ms_block_header(
                                                   mode, std::string_view(header.data(), n), at, size - at, where));
    Block b{h, at + header_bytes, plain, h.cipher_len};
    if (mode != EncryptionMode::kAesGcm && cipher != nullptr) {
      // The last cipher block and the 16 bytes before it (the IV for a one-block cipher).
      const uint64_t last = b.cipher_at + h.cipher_len - 16;
      if (h.cipher_len == 16) {
        std::memcpy(last32.data(), h.iv.data(), 16);
        DISTCKPT_RETURN_IF_ERROR(file.read_at(last32.data() + 16, 16, last));
      } else {
        DISTCKPT_RETURN_IF_ERROR(file.read_at(last32.data(), 32, last - 16));
      }
      DISTCKPT_ASSIGN_OR_RETURN(b.plain_len,
                                cipher->plain_length(h, last32, where + " block " + std::to_string(blocks.size())));
    }
    plain += b.plain_len;
    at = b.cipher_at + h.cipher_len;
    blocks.push_back(std::move(b));
  }
  if (blocks.empty()) return corruption(where + ": an encrypted file without blocks");
  return blocks;
}

Result<std::unique_ptr<ReadableFile>> open_framed(std::unique_ptr<ReadableFile> base, uint64_t size,
                                                  EncryptionMode mode, const EncryptionKey& key, const std::string& path) {
  const std::string where = "'" + path + "'";
  auto cipher = MsBlockCipher::create(mode, key);
  if (!cipher.ok()) return auth_failed(where + ": " + cipher.status().message() + ": wrong key");
  DISTCKPT_ASSIGN_OR_RETURN(std::vector<Block> blocks, read_block_table(*base, size, mode, &*cipher, where));
  const uint64_t plain = blocks.back().plain_at + blocks.back().plain_len;
  return std::unique_ptr<ReadableFile>(
      std::make_unique<FramedReadable>(std::move(base), std::move(*cipher), std::move(blocks), plain, size, path));
}

bool is_ckpt_name(const std::string& path) {
  const FormatDriver* d = driver_for_file_name(path);
  return d != nullptr && d->id == Format::kCkpt;
}

class KeyedFileSystem final : public FileSystem {
 public:
  KeyedFileSystem(std::shared_ptr<FileSystem> base, std::shared_ptr<const EncryptionKey> key)
      : base_(std::move(base)), key_(std::move(key)) {}
  bool has_key(const EncryptionKey& key) const {
    return key.size() == key_->size() && std::memcmp(key.data(), key_->data(), key.size()) == 0;
  }

  Result<std::unique_ptr<ReadableFile>> open_readable(const std::string& path) override {
    DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, base_->open_readable(path));
    if (!is_ckpt_name(path)) return file;
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file->size());
    if (size < 4) return file;
    char head[4];
    DISTCKPT_RETURN_IF_ERROR(file->read_at(head, 4, 0));
    const auto mode = framed_mode(std::string_view(head, 4));
    if (!mode) return file;
    return open_framed(std::move(file), size, *mode, *key_, path);
  }
  Result<uint64_t> file_size(const std::string& path) override {
    if (!is_ckpt_name(path)) return base_->file_size(path);
    DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, open_readable(path));
    return file->size();
  }

  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path,
                                                      const WriteOpenOptions& options = {}) override {
    return base_->open_writable(path, options);
  }
  Status create_dir(const std::string& path) override { return base_->create_dir(path); }
  Status create_dirs(const std::string& path) override { return base_->create_dirs(path); }
  Status rename(const std::string& from, const std::string& to) override { return base_->rename(from, to); }
  Status rename_no_replace(const std::string& from, const std::string& to) override {
    return base_->rename_no_replace(from, to);
  }
  Status remove_file(const std::string& path) override { return base_->remove_file(path); }
  Status link_file(const std::string& from, const std::string& to) override { return base_->link_file(from, to); }
  Status remove_all(const std::string& path) override { return base_->remove_all(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override { return base_->list_dir(path); }
  bool exists(const std::string& path) override { return base_->exists(path); }
  Status sync_dir(const std::string& path) override { return base_->sync_dir(path); }
  Status sync_file(const std::string& path) override { return base_->sync_file(path); }
  Status evict_cached(const std::string& path) override { return base_->evict_cached(path); }
  Status append_synced(const std::string& path, const std::string& data) override {
    return base_->append_synced(path, data);
  }
  Result<int64_t> modified_time_ns(const std::string& path) override { return base_->modified_time_ns(path); }

 private:
  std::shared_ptr<FileSystem> base_;
  std::shared_ptr<const EncryptionKey> key_;
};

}  // namespace

std::optional<EncryptionMode> framed_mode(std::string_view head) { return internal_transform::ms_framing_mode(head); }

Result<uint64_t> check_framing(const ReadableFile& file, uint64_t size, EncryptionMode mode, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(std::vector<Block> blocks, read_block_table(file, size, mode, nullptr, "'" + path + "'"));
  return static_cast<uint64_t>(blocks.size());
}

Result<std::unique_ptr<WritableFile>> framed_writable(std::unique_ptr<WritableFile> base, EncryptionMode mode,
                                                      const EncryptionKey& key) {
  DISTCKPT_ASSIGN_OR_RETURN(MsBlockCipher cipher, MsBlockCipher::create(mode, key));
  return std::unique_ptr<WritableFile>(std::make_unique<FramedWritable>(std::move(base), std::move(cipher)));
}

std::shared_ptr<FileSystem> with_key(std::shared_ptr<FileSystem> fs, const EncryptionKey* key) {
  if (key == nullptr) return fs;
  // Already seen with this key (the manager's file system, wrapped again by a load it
  // makes): a second layer would decrypt the first block again at every open.
  if (const auto* keyed = dynamic_cast<const KeyedFileSystem*>(fs.get()); keyed != nullptr && keyed->has_key(*key))
    return fs;
  return std::make_shared<KeyedFileSystem>(std::move(fs), std::make_shared<const EncryptionKey>(*key));
}

std::optional<FramingInfo> framing_of(const ReadableFile& file) {
  const auto* framed = dynamic_cast<const FramedReadable*>(&file);
  if (framed == nullptr) return std::nullopt;
  return framed->info();
}

}  // namespace distckpt::internal_format
