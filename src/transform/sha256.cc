#include "transform/sha256.h"

#include <openssl/evp.h>

#include <memory>
#include <vector>

namespace distckpt::internal_transform {
namespace {

using MdCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

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

Result<std::string> sha256_file(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(path));
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file->size());
  MdCtx ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return internal_error("sha256 '" + path + "': OpenSSL cannot start a SHA-256 digest");
  std::vector<char> buf(std::min<uint64_t>(size, uint64_t{8} << 20));
  for (uint64_t done = 0; done < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(buf.size(), size - done));
    DISTCKPT_RETURN_IF_ERROR(file->read_at(buf.data(), n, done));
    if (EVP_DigestUpdate(ctx.get(), buf.data(), n) != 1)
      return internal_error("sha256 '" + path + "': EVP_DigestUpdate failed");
    done += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &length) != 1)
    return internal_error("sha256 '" + path + "': EVP_DigestFinal_ex failed");
  return to_hex(digest, length);
}

std::string sha256_hex(const void* data, std::size_t n) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, n, digest, &length, EVP_sha256(), nullptr) != 1) return "";
  return to_hex(digest, length);
}

}  // namespace distckpt::internal_transform
