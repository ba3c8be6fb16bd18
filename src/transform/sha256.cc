#include "transform/sha256.h"

#include <openssl/evp.h>

namespace distckpt::internal_transform {
namespace {

std::string to_hex(const unsigned char* digest, unsigned int n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace

struct Sha256::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Result<Sha256> Sha256::start() {
  auto ctx = std::make_shared<Ctx>();
  if (ctx->md == nullptr || EVP_DigestInit_ex(ctx->md, EVP_sha256(), nullptr) != 1)
    return internal_error("OpenSSL cannot start a SHA-256 digest");
  return Sha256(std::move(ctx));
}

Status Sha256::update(const void* data, std::size_t n) {
  if (EVP_DigestUpdate(ctx_->md, data, n) != 1) return internal_error("SHA-256: EVP_DigestUpdate failed");
  return Status();
}

Result<std::string> Sha256::finish_hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx_->md, digest, &length) != 1) return internal_error("SHA-256: EVP_DigestFinal_ex failed");
  return to_hex(digest, length);
}

std::string sha256_hex(const void* data, std::size_t n) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, n, digest, &length, EVP_sha256(), nullptr) != 1) return "";
  return to_hex(digest, length);
}

}  // namespace distckpt::internal_transform
