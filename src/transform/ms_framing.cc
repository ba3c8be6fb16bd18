#include "transform/ms_framing.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cstring>

#include "base/test_seams.h"
#include "transform/evp.h"

namespace distckpt::internal_transform {

namespace {

constexpr uint32_t kGcmMagic = 0x7F3A5ED8, kCbcMagic = 0x7F3A5ED9, kSm4CbcMagic = 0x7F3A5EDA;
constexpr std::size_t kCbcBlock = 16;

uint32_t get_u32le(std::string_view b, std::size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}
void put_u32le(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t magic_of(EncryptionMode mode) {
  return mode == EncryptionMode::kAesGcm ? kGcmMagic : mode == EncryptionMode::kAesCbc ? kCbcMagic : kSm4CbcMagic;
}
// The length field's bytes beside the cipher: block_size counts iv_len, the IV and cipher_len.
constexpr uint32_t kAroundCipher = 4 + kMsIvBytes + 4;
uint64_t max_cipher(EncryptionMode mode) {
  return mode == EncryptionMode::kAesGcm ? kMsMaxBlockPlain : kMsMaxBlockPlain + kCbcBlock;
}

}  // namespace

std::optional<EncryptionMode> ms_framing_mode(std::string_view head) {
  if (head.size() < 4) return std::nullopt;
  switch (get_u32le(head, 0)) {
    case kGcmMagic: return EncryptionMode::kAesGcm;
    case kCbcMagic: return EncryptionMode::kAesCbc;
    case kSm4CbcMagic: return EncryptionMode::kSm4Cbc;
    default: return std::nullopt;
  }
}

std::size_t ms_header_bytes(EncryptionMode mode) {
  return 4 + (mode == EncryptionMode::kAesGcm ? kMsTagBytes : 0) + 4 + kAroundCipher;  // 48 or 32
}

Result<MsBlockHeader> parse_ms_block_header(EncryptionMode mode, std::string_view bytes, uint64_t at,
                                            uint64_t remaining, const std::string& where) {
  const std::string here = where + ": the encrypted block at byte " + std::to_string(at);
  const std::size_t header = ms_header_bytes(mode);
  if (bytes.size() < header || remaining < header) return corruption(here + " is cut short");
  if (ms_framing_mode(bytes) != mode)
    return corruption(here + " does not start with the " + std::string(encryption_mode_name(mode)) + " magic");
  MsBlockHeader h;
  h.mode = mode;
  std::size_t p = 4;
  if (mode == EncryptionMode::kAesGcm) {
    // An early 1.x GCM block has no tag: block_size then follows the magic, iv_len 16 after it.
    if (get_u32le(bytes, 8) == kMsIvBytes && get_u32le(bytes, 4 + kMsTagBytes + 4) != kMsIvBytes)
      return unsupported(here + " is in an early MindSpore 1.x framing (one magic for every mode, no GCM tag), "
                         "which distckpt does not read: decrypt it with that MindSpore version");
    h.tag.assign(bytes.substr(p, kMsTagBytes));
    p += kMsTagBytes;
  }
  const uint32_t block_size = get_u32le(bytes, p);
  const uint32_t iv_len = get_u32le(bytes, p + 4);
  h.iv.assign(bytes.substr(p + 8, kMsIvBytes));
  h.cipher_len = get_u32le(bytes, p + 8 + kMsIvBytes);
  if (iv_len != kMsIvBytes) return corruption(here + ": iv_len " + std::to_string(iv_len) + ", not 16");
  if (h.cipher_len == 0 || h.cipher_len > max_cipher(mode))
    return corruption(here + ": cipher length " + std::to_string(h.cipher_len) + " is not within 1.." +
                      std::to_string(max_cipher(mode)));
  if (mode != EncryptionMode::kAesGcm && h.cipher_len % kCbcBlock != 0)
    return corruption(here + ": cipher length " + std::to_string(h.cipher_len) + " is not a whole number of blocks");
  if (block_size != uint64_t{kAroundCipher} + h.cipher_len)
    return corruption(here + ": block_size " + std::to_string(block_size) + " does not match cipher length " +
                      std::to_string(h.cipher_len));
  if (h.cipher_len > remaining - header) return corruption(here + " runs past the end of the file");
  return h;
}

std::string ms_block_header(const MsBlockHeader& h) {
  std::string out;
  put_u32le(out, magic_of(h.mode));
  if (h.mode == EncryptionMode::kAesGcm) out += h.tag;
  put_u32le(out, kAroundCipher + h.cipher_len);
  put_u32le(out, kMsIvBytes);
  out += h.iv;
  put_u32le(out, h.cipher_len);
  return out;
}

struct MsBlockCipher::Stream {
  CipherCtx cipher;
};

Result<MsBlockCipher> MsBlockCipher::create(EncryptionMode mode, const EncryptionKey& key) {
  if (mode == EncryptionMode::kNone) return invalid_argument("MindSpore's framing needs an encryption mode");
  if (mode == EncryptionMode::kSm4Cbc ? key.size() != 16 : !(key.size() == 16 || key.size() == 24 || key.size() == 32))
    return invalid_argument(std::string(encryption_mode_name(mode)) + " takes a " +
                            (mode == EncryptionMode::kSm4Cbc ? "16-byte" : "16-, 24- or 32-byte") + " key, not " +
                            std::to_string(key.size()) + " bytes");
  MsBlockCipher c;
  c.mode_ = mode;
  c.key_.assign(reinterpret_cast<const char*>(key.data()), key.size());
  return c;
}

MsBlockCipher::~MsBlockCipher() {
  if (!key_.empty()) OPENSSL_cleanse(key_.data(), key_.size());
}

std::string MsBlockCipher::algorithm() const {
  if (mode_ == EncryptionMode::kSm4Cbc) return "SM4-CBC";
  return "AES-" + std::to_string(key_.size() * 8) + (mode_ == EncryptionMode::kAesGcm ? "-GCM" : "-CBC");
}

Status MsBlockCipher::begin(std::string* iv) {
  iv->assign(kMsIvBytes, '\0');
  if (!internal_base::seeded_random_bytes(iv->data(), iv->size()) &&
      RAND_bytes(reinterpret_cast<unsigned char*>(iv->data()), static_cast<int>(kMsIvBytes)) != 1)
    return openssl_error("RAND_bytes");
  stream_ = std::make_shared<Stream>();
  return init_evp(stream_->cipher.ctx, true, mode_, key_.size(), key_, *iv, true);
}

Status MsBlockCipher::update(const void* in, std::size_t n, void* out, std::size_t* out_n) {
  if (!stream_) return internal_error("MindSpore framing: update() outside a block");
  int produced = 0;
  // Blocks hold at most 64 MiB, so every piece fits EVP's int lengths.
  if (EVP_EncryptUpdate(stream_->cipher.ctx, static_cast<unsigned char*>(out), &produced,
                        static_cast<const unsigned char*>(in), static_cast<int>(n)) != 1)
    return openssl_error("EVP_EncryptUpdate");
  *out_n = static_cast<std::size_t>(produced);
  return Status();
}

Status MsBlockCipher::finish(void* out, std::size_t* out_n, std::string* tag) {
  if (!stream_) return internal_error("MindSpore framing: finish() outside a block");
  int produced = 0;
  if (EVP_EncryptFinal_ex(stream_->cipher.ctx, static_cast<unsigned char*>(out), &produced) != 1)
    return openssl_error("EVP_EncryptFinal_ex");
  *out_n = static_cast<std::size_t>(produced);
  tag->clear();
  if (mode_ == EncryptionMode::kAesGcm) {
    tag->assign(kMsTagBytes, '\0');
    if (EVP_CIPHER_CTX_ctrl(stream_->cipher.ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kMsTagBytes), tag->data()) != 1)
      return openssl_error("EVP_CTRL_GCM_GET_TAG");
  }
  stream_.reset();
  return Status();
}

Status MsBlockCipher::decrypt(const MsBlockHeader& header, const void* in, void* out, uint64_t* plain_len,
                              const std::string& where) const {
  CipherCtx ctx;
  DISTCKPT_RETURN_IF_ERROR(init_evp(ctx.ctx, false, mode_, key_.size(), key_, header.iv, true));
  const std::string failed = where + ": decryption failed (" + algorithm() +
                             (mode_ == EncryptionMode::kAesGcm ? ": the tag does not match" : ": bad padding") +
                             "): a wrong key, or modified bytes";
  int produced = 0, last = 0;
  auto* o = static_cast<unsigned char*>(out);
  if (EVP_DecryptUpdate(ctx.ctx, o, &produced, static_cast<const unsigned char*>(in),
                        static_cast<int>(header.cipher_len)) != 1)
    return auth_failed(failed);
  if (mode_ == EncryptionMode::kAesGcm &&
      EVP_CIPHER_CTX_ctrl(ctx.ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kMsTagBytes),
                          const_cast<char*>(header.tag.data())) != 1)
    return openssl_error("EVP_CTRL_GCM_SET_TAG");
  if (EVP_DecryptFinal_ex(ctx.ctx, o + produced, &last) != 1) return auth_failed(failed);
  *plain_len = static_cast<uint64_t>(produced) + static_cast<uint64_t>(last);
  return Status();
}

Result<uint64_t> MsBlockCipher::plain_length(const MsBlockHeader& header, std::string_view last32,
                                             const std::string& where) const {
  if (mode_ == EncryptionMode::kAesGcm) return uint64_t{header.cipher_len};
  if (last32.size() != 2 * kCbcBlock) return internal_error("plain_length: 32 bytes expected");
  CipherCtx ctx;
  const std::string previous(last32.substr(0, kCbcBlock));  // the last block's IV
  DISTCKPT_RETURN_IF_ERROR(init_evp(ctx.ctx, false, mode_, key_.size(), key_, previous, false));
  unsigned char plain[kCbcBlock];
  int produced = 0;
  if (EVP_DecryptUpdate(ctx.ctx, plain, &produced, reinterpret_cast<const unsigned char*>(last32.data()) + kCbcBlock,
                        static_cast<int>(kCbcBlock)) != 1 ||
      produced != static_cast<int>(kCbcBlock))
    return openssl_error("EVP_DecryptUpdate");
  const unsigned pad = plain[kCbcBlock - 1];
  bool good = pad >= 1 && pad <= kCbcBlock;
  for (unsigned i = 0; good && i < pad; ++i) good = plain[kCbcBlock - 1 - i] == pad;
  OPENSSL_cleanse(plain, sizeof plain);
  if (!good)
    return auth_failed(where + ": decryption failed (" + algorithm() + ": bad padding): a wrong key, or modified bytes");
  return uint64_t{header.cipher_len} - pad;
}

}  // namespace distckpt::internal_transform
