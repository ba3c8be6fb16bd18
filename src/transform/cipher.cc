#include "transform/cipher.h"

#include "base/test_seams.h"
#include "transform/evp.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

namespace distckpt {

namespace internal_transform {

Status openssl_error(const std::string& what) { return internal_error("OpenSSL: " + what + " failed"); }

const EVP_CIPHER* evp_cipher(EncryptionMode mode, std::size_t key_bytes) {
  switch (mode) {
    case EncryptionMode::kAesGcm:
      return key_bytes == 16 ? EVP_aes_128_gcm() : key_bytes == 24 ? EVP_aes_192_gcm() : EVP_aes_256_gcm();
    case EncryptionMode::kAesCbc:
      return key_bytes == 16 ? EVP_aes_128_cbc() : key_bytes == 24 ? EVP_aes_192_cbc() : EVP_aes_256_cbc();
    case EncryptionMode::kSm4Cbc: return EVP_sm4_cbc();
    case EncryptionMode::kNone: break;
  }
  return nullptr;
}

Status init_evp(EVP_CIPHER_CTX* ctx, bool encrypt, EncryptionMode mode, std::size_t key_bytes, const std::string& key,
                const std::string& iv, bool padding) {
  if (ctx == nullptr) return openssl_error("EVP_CIPHER_CTX_new");
  const EVP_CIPHER* cipher = evp_cipher(mode, key_bytes);
  if (cipher == nullptr) return internal_error("no cipher for mode " + std::string(encryption_mode_name(mode)));
  if (EVP_CipherInit_ex(ctx, cipher, nullptr, nullptr, nullptr, encrypt ? 1 : 0) != 1)
    return openssl_error("EVP_CipherInit_ex");
  if (mode == EncryptionMode::kAesGcm &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(iv.size()), nullptr) != 1)
    return openssl_error("EVP_CTRL_GCM_SET_IVLEN");
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, reinterpret_cast<const unsigned char*>(key.data()),
                        reinterpret_cast<const unsigned char*>(iv.data()), encrypt ? 1 : 0) != 1)
    return openssl_error("EVP_CipherInit_ex(key)");
  if (mode != EncryptionMode::kAesGcm) EVP_CIPHER_CTX_set_padding(ctx, padding ? 1 : 0);
  return Status();
}

namespace {

constexpr std::size_t kGcmNonce = 12, kGcmTag = 16, kCbcBlock = 16, kHmacTag = 32;
// EVP lengths are ints: larger buffers go in pieces.
constexpr std::size_t kEvpPiece = std::size_t{1} << 30;
// GCM encrypts at most 2^39 - 256 bits under one nonce.
constexpr uint64_t kGcmMaxBytes = (uint64_t{1} << 36) - 32;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

Result<std::string> hkdf(const EncryptionKey& key, const std::string& salt, const char* info, std::size_t n) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) return openssl_error("EVP_KDF_fetch(HKDF)");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) return openssl_error("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<unsigned char*>(key.data()), key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info), std::strlen(info)),
      OSSL_PARAM_construct_end()};
  std::string out(n, '\0');
  const int ok = EVP_KDF_derive(ctx, reinterpret_cast<unsigned char*>(out.data()), n, params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) return openssl_error("HKDF");
  return out;
}

struct MacCtx {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
  ~MacCtx() {
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
  }
  Status init(const std::string& key) {
    mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (mac == nullptr) return openssl_error("EVP_MAC_fetch(HMAC)");
    ctx = EVP_MAC_CTX_new(mac);
    if (ctx == nullptr) return openssl_error("EVP_MAC_CTX_new");
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    if (EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1)
      return openssl_error("EVP_MAC_init");
    return Status();
  }
  Status update(const void* p, std::size_t n) {
    if (n > 0 && EVP_MAC_update(ctx, static_cast<const unsigned char*>(p), n) != 1) return openssl_error("EVP_MAC_update");
    return Status();
  }
  Result<std::string> final() {
    std::string out(kHmacTag, '\0');
    std::size_t n = 0;
    if (EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &n, out.size()) != 1 || n != kHmacTag)
      return openssl_error("EVP_MAC_final");
    return out;
  }
};

Result<std::string> hmac(const std::string& key, const std::string& data) {
  MacCtx mac;
  DISTCKPT_RETURN_IF_ERROR(mac.init(key));
  DISTCKPT_RETURN_IF_ERROR(mac.update(data.data(), data.size()));
  return mac.final();
}

// Starts the HMAC of a CBC chunk: length of the associated data, the data, the IV.
Status begin_cbc_mac(MacCtx& mac, const std::string& key, const std::string& aad, const std::string& iv) {
  DISTCKPT_RETURN_IF_ERROR(mac.init(key));
  std::string head;
  put_u64(head, aad.size());
  head += aad;
  head += iv;
  return mac.update(head.data(), head.size());
}

// Whether `tag` is the HMAC of a CBC ciphertext (`n` bytes at `data`), compared in
// constant time; `failed` otherwise.
Status check_cbc_tag(const std::string& key, const std::string& aad, const std::string& iv, const void* data,
                     std::size_t n, const std::string& tag, const std::string& failed) {
  MacCtx mac;
  DISTCKPT_RETURN_IF_ERROR(begin_cbc_mac(mac, key, aad, iv));
  DISTCKPT_RETURN_IF_ERROR(mac.update(data, n));
  DISTCKPT_ASSIGN_OR_RETURN(std::string expected, mac.final());
  if (tag.size() != kHmacTag || CRYPTO_memcmp(expected.data(), tag.data(), kHmacTag) != 0) return auth_failed(failed);
  return Status();
}

// CBC: padding is added by the sealer and removed by hand when opening (the caller's
// buffer holds the plaintext exactly, not a padded block).
Status init_cipher(EVP_CIPHER_CTX* ctx, bool encrypt, EncryptionMode mode, std::size_t key_bytes,
                   const std::string& key, const std::string& nonce) {
  return init_evp(ctx, encrypt, mode, key_bytes, key, nonce, encrypt || mode == EncryptionMode::kAesGcm);
}

// In pieces of at most kEvpPiece bytes. `out` may equal `in`; a null `out` feeds GCM's
// associated data (OpenSSL then reports the piece as "produced": nothing is written,
// and the null pointer must stay null).
Status cipher_update(EVP_CIPHER_CTX* ctx, const unsigned char* in, std::size_t n, unsigned char* out,
                     std::size_t* out_n) {
  *out_n = 0;
  for (std::size_t done = 0; done < n;) {
    const std::size_t piece = std::min(kEvpPiece, n - done);
    int produced = 0;
    if (EVP_CipherUpdate(ctx, out == nullptr ? nullptr : out + *out_n, &produced, in + done,
                         static_cast<int>(piece)) != 1)
      return openssl_error("EVP_CipherUpdate");
    if (out != nullptr) *out_n += static_cast<std::size_t>(produced);
    done += piece;
  }
  return Status();
}

}  // namespace

std::string chunk_aad(const std::string& tensor, uint64_t chunk, const std::string& file, uint64_t byte_offset,
                      uint64_t stored_length, uint64_t plain_length) {
  std::string aad = "distckpt chunk v1";
  put_u64(aad, tensor.size());
  aad += tensor;
  put_u64(aad, chunk);
  put_u64(aad, file.size());
  aad += file;
  put_u64(aad, byte_offset);
  put_u64(aad, stored_length);
  put_u64(aad, plain_length);
  return aad;
}

Result<std::shared_ptr<const CheckpointCipher>> CheckpointCipher::create(EncryptionMode mode, const EncryptionKey& key,
                                                                         const std::string& salt) {
  if (mode == EncryptionMode::kNone) return invalid_argument("no encryption mode");
  if (!valid_key_size(key.size()))
    return invalid_argument("an encryption key has 16, 24 or 32 bytes, not " + std::to_string(key.size()));
  if (mode == EncryptionMode::kSm4Cbc && key.size() != 16)
    return invalid_argument("SM4-CBC takes a 16-byte key, not " + std::to_string(key.size()) + " bytes");
  if (salt.size() != kSaltBytes)
    return corruption("the encryption salt has " + std::to_string(salt.size()) + " bytes, not " +
                      std::to_string(kSaltBytes));
  if (evp_cipher(mode, key.size()) == nullptr)
    return unsupported(std::string(encryption_mode_name(mode)) + " is not available in this OpenSSL");
  std::shared_ptr<CheckpointCipher> c(new CheckpointCipher());
  c->mode_ = mode;
  c->key_bytes_ = key.size();
  c->salt_ = salt;
  DISTCKPT_ASSIGN_OR_RETURN(c->data_key_, hkdf(key, salt, "distckpt v1 data key", key.size()));
  DISTCKPT_ASSIGN_OR_RETURN(c->index_key_, hkdf(key, salt, "distckpt v1 index key", key.size()));
  DISTCKPT_ASSIGN_OR_RETURN(c->mac_key_, hkdf(key, salt, "distckpt v1 mac key", 32));
  DISTCKPT_ASSIGN_OR_RETURN(c->iv_key_, hkdf(key, salt, "distckpt v1 iv key", 32));
  return std::shared_ptr<const CheckpointCipher>(std::move(c));
}

Result<std::string> CheckpointCipher::random_bytes(std::size_t n) {
  std::string salt(n, '\0');
  if (internal_base::seeded_random_bytes(salt.data(), salt.size())) return salt;
  return unique_bytes(n);
}

Result<std::string> CheckpointCipher::unique_bytes(std::size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(bytes.size())) != 1)
    return openssl_error("RAND_bytes");
  return bytes;
}

CheckpointCipher::~CheckpointCipher() {
  for (std::string* k : {&data_key_, &index_key_, &mac_key_, &iv_key_}) OPENSSL_cleanse(k->data(), k->size());
}

std::string CheckpointCipher::algorithm() const {
  const std::string bits = std::to_string(key_bytes_ * 8);
  switch (mode_) {
    case EncryptionMode::kAesGcm: return "AES-" + bits + "-GCM";
    case EncryptionMode::kAesCbc: return "AES-" + bits + "-CBC-HMAC-SHA256";
    case EncryptionMode::kSm4Cbc: return "SM4-CBC-HMAC-SHA256";
    case EncryptionMode::kNone: break;
  }
  return "none";
}

uint64_t stored_length(EncryptionMode mode, uint64_t plain) {
  if (mode == EncryptionMode::kAesGcm || mode == EncryptionMode::kNone) return plain;
  if (plain > UINT64_MAX - kCbcBlock) return UINT64_MAX;  // never a valid length: refused by its checks
  return plain + (kCbcBlock - plain % kCbcBlock);
}

std::size_t CheckpointCipher::nonce_bytes() const { return mode_ == EncryptionMode::kAesGcm ? kGcmNonce : kCbcBlock; }
std::size_t CheckpointCipher::tag_bytes() const { return mode_ == EncryptionMode::kAesGcm ? kGcmTag : kHmacTag; }

std::string CheckpointCipher::chunk_nonce(uint32_t tensor, uint64_t chunk) const {
  std::string id;
  put_u32(id, tensor);
  put_u64(id, chunk);
  if (mode_ == EncryptionMode::kAesGcm) return id;
  auto mac = hmac(iv_key_, id);
  // HMAC cannot fail short of an OpenSSL fault; a zero IV would still be unique per key
  // only by luck, so fall back to a random one (stored in the index like any IV).
  if (!mac.ok()) {
    std::string iv(kCbcBlock, '\0');
    (void)RAND_bytes(reinterpret_cast<unsigned char*>(iv.data()), static_cast<int>(iv.size()));
    return iv;
  }
  return mac->substr(0, kCbcBlock);
}

struct CheckpointCipher::Sealer::State {
  CipherCtx cipher;
  MacCtx mac;
  EncryptionMode mode = EncryptionMode::kNone;
  uint64_t total = 0;
};

CheckpointCipher::Sealer::Sealer(std::unique_ptr<State> state) : state_(std::move(state)) {}
CheckpointCipher::Sealer::Sealer(Sealer&&) noexcept = default;
CheckpointCipher::Sealer::~Sealer() = default;

Result<CheckpointCipher::Sealer> CheckpointCipher::begin_seal(const std::string& nonce, const std::string& aad) const {
  if (nonce.size() != nonce_bytes()) return internal_error("seal: nonce of " + std::to_string(nonce.size()) + " bytes");
  auto state = std::make_unique<Sealer::State>();
  state->mode = mode_;
  DISTCKPT_RETURN_IF_ERROR(init_cipher(state->cipher.ctx, true, mode_, key_bytes_, data_key_, nonce));
  if (mode_ == EncryptionMode::kAesGcm) {
    int ignored = 0;
    for (std::size_t done = 0; done < aad.size();) {
      const std::size_t piece = std::min(kEvpPiece, aad.size() - done);
      if (EVP_EncryptUpdate(state->cipher.ctx, nullptr, &ignored,
                            reinterpret_cast<const unsigned char*>(aad.data()) + done, static_cast<int>(piece)) != 1)
        return openssl_error("EVP_EncryptUpdate(aad)");
      done += piece;
    }
  } else {
    DISTCKPT_RETURN_IF_ERROR(begin_cbc_mac(state->mac, mac_key_, aad, nonce));
  }
  return Sealer(std::move(state));
}

Status CheckpointCipher::Sealer::update(const void* in, std::size_t n, void* out, std::size_t* out_n) {
  State& s = *state_;
  s.total += n;
  if (s.mode == EncryptionMode::kAesGcm && s.total > kGcmMaxBytes)
    return invalid_argument("a chunk of more than 64 GiB cannot be encrypted with AES-GCM under one nonce");
  DISTCKPT_RETURN_IF_ERROR(cipher_update(s.cipher.ctx, static_cast<const unsigned char*>(in), n,
                                         static_cast<unsigned char*>(out), out_n));
  if (s.mode != EncryptionMode::kAesGcm) DISTCKPT_RETURN_IF_ERROR(s.mac.update(out, *out_n));
  return Status();
}

Status CheckpointCipher::Sealer::finish(void* out, std::size_t* out_n, std::string* tag) {
  State& s = *state_;
  int produced = 0;
  if (EVP_EncryptFinal_ex(s.cipher.ctx, static_cast<unsigned char*>(out), &produced) != 1)
    return openssl_error("EVP_EncryptFinal_ex");
  *out_n = static_cast<std::size_t>(produced);
  if (s.mode == EncryptionMode::kAesGcm) {
    tag->assign(kGcmTag, '\0');
    if (EVP_CIPHER_CTX_ctrl(s.cipher.ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kGcmTag), tag->data()) != 1)
      return openssl_error("EVP_CTRL_GCM_GET_TAG");
    return Status();
  }
  DISTCKPT_RETURN_IF_ERROR(s.mac.update(out, *out_n));
  DISTCKPT_ASSIGN_OR_RETURN(*tag, s.mac.final());
  return Status();
}

Status CheckpointCipher::open(const std::string& nonce, const std::string& aad, const void* in, uint64_t stored,
                              void* out, uint64_t plain, const std::string& tag, const std::string& where) const {
  return open_with(data_key_, nonce, aad, in, stored, out, plain, tag, where);
}

Status CheckpointCipher::open_with(const std::string& key, const std::string& nonce, const std::string& aad,
                                   const void* in, uint64_t stored, void* out, uint64_t plain, const std::string& tag,
                                   const std::string& where) const {
  if (nonce.size() != nonce_bytes() || tag.size() != tag_bytes())
    return auth_failed(where + ": its nonce (" + std::to_string(nonce.size()) + " bytes) or tag (" +
                       std::to_string(tag.size()) + " bytes) has the wrong size for " + algorithm());
  if (stored != stored_length(plain))
    return corruption(where + ": " + std::to_string(stored) + " stored bytes cannot hold " + std::to_string(plain) +
                      " bytes with " + algorithm());
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  const std::string failed = where + ": authentication failed (" + algorithm() +
                             "): wrong key, or the bytes were modified or belong to another chunk";
  CipherCtx cipher;
  if (mode_ == EncryptionMode::kAesGcm) {
    DISTCKPT_RETURN_IF_ERROR(init_cipher(cipher.ctx, false, mode_, key_bytes_, key, nonce));
    std::size_t n = 0;
    DISTCKPT_RETURN_IF_ERROR(cipher_update(cipher.ctx, reinterpret_cast<const unsigned char*>(aad.data()), aad.size(),
                                           nullptr, &n));
    Status decrypted = cipher_update(cipher.ctx, src, stored, dst, &n);
    if (decrypted.ok() && EVP_CIPHER_CTX_ctrl(cipher.ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag.size()),
                                              const_cast<char*>(tag.data())) != 1)
      decrypted = openssl_error("EVP_CTRL_GCM_SET_TAG");
    if (!decrypted.ok()) {
      OPENSSL_cleanse(dst, plain);
      return decrypted;
    }
    int last = 0;
    unsigned char none[16];
    if (EVP_DecryptFinal_ex(cipher.ctx, none, &last) != 1) {
      // GCM decrypted before it could authenticate: leave nothing of it behind.
      OPENSSL_cleanse(dst, plain);
      return auth_failed(failed);
    }
    return Status();
  }
  // CBC: the HMAC of the ciphertext first (encrypt-then-MAC), then decrypt.
  DISTCKPT_RETURN_IF_ERROR(check_cbc_tag(mac_key_, aad, nonce, src, stored, tag, failed));
  DISTCKPT_RETURN_IF_ERROR(init_cipher(cipher.ctx, false, mode_, key_bytes_, key, nonce));
  const uint64_t whole = plain / kCbcBlock * kCbcBlock;  // blocks of plaintext only
  std::size_t n = 0;
  DISTCKPT_RETURN_IF_ERROR(cipher_update(cipher.ctx, src, whole, dst, &n));
  unsigned char last[kCbcBlock];
  DISTCKPT_RETURN_IF_ERROR(cipher_update(cipher.ctx, src + whole, kCbcBlock, last, &n));
  const uint64_t pad = stored - plain;
  for (uint64_t i = plain - whole; i < kCbcBlock; ++i)
    if (last[i] != pad) return corruption(where + ": bad padding after a valid tag (a writer bug)");
  std::memcpy(dst + whole, last, plain - whole);
  OPENSSL_cleanse(last, sizeof(last));
  return Status();
}

Status CheckpointCipher::seal_with(const std::string& key, const std::string& nonce, const std::string& aad,
                                   const std::string& plain, std::string* sealed, std::string* tag) const {
  CipherCtx cipher;
  DISTCKPT_RETURN_IF_ERROR(init_cipher(cipher.ctx, true, mode_, key_bytes_, key, nonce));
  sealed->assign(plain.size() + kCbcBlock, '\0');
  auto* out = reinterpret_cast<unsigned char*>(sealed->data());
  std::size_t n = 0, m = 0;
  MacCtx mac;
  if (mode_ == EncryptionMode::kAesGcm) {
    DISTCKPT_RETURN_IF_ERROR(cipher_update(cipher.ctx, reinterpret_cast<const unsigned char*>(aad.data()), aad.size(),
                                           nullptr, &n));
  } else {
    DISTCKPT_RETURN_IF_ERROR(begin_cbc_mac(mac, mac_key_, aad, nonce));
  }
  DISTCKPT_RETURN_IF_ERROR(
      cipher_update(cipher.ctx, reinterpret_cast<const unsigned char*>(plain.data()), plain.size(), out, &n));
  int last = 0;
  if (EVP_EncryptFinal_ex(cipher.ctx, out + n, &last) != 1) return openssl_error("EVP_EncryptFinal_ex");
  m = n + static_cast<std::size_t>(last);
  sealed->resize(m);
  if (mode_ == EncryptionMode::kAesGcm) {
    tag->assign(kGcmTag, '\0');
    if (EVP_CIPHER_CTX_ctrl(cipher.ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kGcmTag), tag->data()) != 1)
      return openssl_error("EVP_CTRL_GCM_GET_TAG");
    return Status();
  }
  DISTCKPT_RETURN_IF_ERROR(mac.update(sealed->data(), sealed->size()));
  DISTCKPT_ASSIGN_OR_RETURN(*tag, mac.final());
  return Status();
}

Status CheckpointCipher::seal_buffer(const std::string& aad, const std::string& plain, const std::string& nonce,
                                     std::string* sealed, std::string* tag) const {
  if (nonce.size() != nonce_bytes()) return internal_error("seal: nonce of " + std::to_string(nonce.size()) + " bytes");
  return seal_with(index_key_, nonce, aad, plain, sealed, tag);
}

Result<std::string> CheckpointCipher::open_buffer(const std::string& aad, const std::string& nonce,
                                                  const std::string& sealed, const std::string& tag,
                                                  const std::string& where) const {
  const std::string failed = where + ": authentication failed (" + algorithm() + "): wrong key or modified bytes";
  if (mode_ == EncryptionMode::kAesGcm) {
    std::string plain(sealed.size(), '\0');
    Status st = open_with(index_key_, nonce, aad, sealed.data(), sealed.size(), plain.data(), plain.size(), tag, where);
    if (st.code() == StatusCode::kAuthFailed) return auth_failed(failed);
    DISTCKPT_RETURN_IF_ERROR(st);
    return plain;
  }
  // CBC: the size of the plaintext is known only from its padding, so the HMAC is
  // checked here, then OpenSSL decrypts and strips the padding.
  if (nonce.size() != nonce_bytes() || tag.size() != tag_bytes() || sealed.empty() || sealed.size() % kCbcBlock != 0)
    return auth_failed(failed);
  DISTCKPT_RETURN_IF_ERROR(check_cbc_tag(mac_key_, aad, nonce, sealed.data(), sealed.size(), tag, failed));
  CipherCtx cipher;
  DISTCKPT_RETURN_IF_ERROR(init_cipher(cipher.ctx, false, mode_, key_bytes_, index_key_, nonce));
  EVP_CIPHER_CTX_set_padding(cipher.ctx, 1);
  std::string plain(sealed.size() + kCbcBlock, '\0');
  std::size_t n = 0;
  DISTCKPT_RETURN_IF_ERROR(cipher_update(cipher.ctx, reinterpret_cast<const unsigned char*>(sealed.data()),
                                         sealed.size(), reinterpret_cast<unsigned char*>(plain.data()), &n));
  int last = 0;
  if (EVP_DecryptFinal_ex(cipher.ctx, reinterpret_cast<unsigned char*>(plain.data()) + n, &last) != 1)
    return corruption(where + ": bad padding after a valid tag (a writer bug)");
  plain.resize(n + static_cast<std::size_t>(last));
  return plain;
}

}  // namespace internal_transform
}  // namespace distckpt
