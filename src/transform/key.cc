// The public encryption vocabulary (distckpt/encryption.h): mode names, keys from bytes,
// files and the environment (wiped when destroyed), and Encryption::validate.
#include <openssl/crypto.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

#include "distckpt/encryption.h"
#include "transform/cipher.h"

namespace distckpt {

using internal_transform::valid_key_size;

std::string_view encryption_mode_name(EncryptionMode mode) {
  switch (mode) {
    case EncryptionMode::kNone: return "none";
    case EncryptionMode::kAesGcm: return "AES-GCM";
    case EncryptionMode::kAesCbc: return "AES-CBC";
    case EncryptionMode::kSm4Cbc: return "SM4-CBC";
  }
  return "none";
}

std::optional<EncryptionMode> encryption_mode_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (EncryptionMode m : {EncryptionMode::kNone, EncryptionMode::kAesGcm, EncryptionMode::kAesCbc,
                           EncryptionMode::kSm4Cbc}) {
    std::string known(encryption_mode_name(m));
    for (char& c : known) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (upper == known) return m;
  }
  return std::nullopt;
}

namespace {


// Hex digits to bytes; nullopt unless every character is a hex digit and there is an
// even number of them.
std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      OPENSSL_cleanse(out.data(), out.size());
      return std::nullopt;
    }
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return s;
}

// Wipes a string holding secret bytes when it goes out of scope.
struct Wiped {
  std::string bytes;
  ~Wiped() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

}  // namespace

Result<EncryptionKey> EncryptionKey::from_bytes(std::string_view bytes) {
  if (!valid_key_size(bytes.size()))
    return invalid_argument("an encryption key has 16, 24 or 32 bytes, not " + std::to_string(bytes.size()));
  EncryptionKey key;
  key.bytes_.assign(bytes.begin(), bytes.end());
  return key;
}

Result<EncryptionKey> EncryptionKey::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("key file '" + path + "' cannot be opened: " + std::strerror(errno));
  constexpr std::size_t kMaxKeyFile = 4096;
  Wiped content;
  content.bytes.resize(kMaxKeyFile + 1);
  in.read(content.bytes.data(), static_cast<std::streamsize>(content.bytes.size()));
  if (in.bad()) return io_error("key file '" + path + "' cannot be read");
  content.bytes.resize(static_cast<std::size_t>(in.gcount()));
  const std::string_view text = trim(content.bytes);
  if (text.size() == 32 || text.size() == 48 || text.size() == 64) {
    if (auto raw = from_hex(text)) {
      Wiped decoded{std::move(*raw)};
      return from_bytes(decoded.bytes);
    }
  }
  if (valid_key_size(content.bytes.size())) return from_bytes(content.bytes);
  return invalid_argument("key file '" + path + "' (" + std::to_string(content.bytes.size()) +
                          " bytes) holds neither 16, 24 or 32 raw bytes nor 32, 48 or 64 hex digits");
}

Result<EncryptionKey> EncryptionKey::from_env(const std::string& variable) {
  const char* value = std::getenv(variable.c_str());
  if (value == nullptr) return not_found("environment variable " + variable + " (the key) is not set");
  const std::string_view text = trim(value);
  if (text.size() == 32 || text.size() == 48 || text.size() == 64) {
    if (auto raw = from_hex(text)) {
      Wiped decoded{std::move(*raw)};
      return from_bytes(decoded.bytes);
    }
  }
  return invalid_argument("environment variable " + variable + " does not hold 32, 48 or 64 hex digits (" +
                          std::to_string(text.size()) + " characters)");
}

Status Encryption::validate() const {
  if (enabled() && mode == EncryptionMode::kNone)
    return invalid_argument("an encryption key with mode none: pick AES-GCM, AES-CBC or SM4-CBC, or pass no key");
  if (!enabled() && mode != EncryptionMode::kAesGcm && mode != EncryptionMode::kNone)
    return invalid_argument("encryption " + std::string(encryption_mode_name(mode)) + " without a key");
  return Status();
}

EncryptionKey::EncryptionKey(const EncryptionKey& other) : bytes_(other.bytes_) {}
EncryptionKey& EncryptionKey::operator=(const EncryptionKey& other) {
  if (this != &other) {
    OPENSSL_cleanse(bytes_.data(), bytes_.size());
    bytes_ = other.bytes_;
  }
  return *this;
}
EncryptionKey::~EncryptionKey() { OPENSSL_cleanse(bytes_.data(), bytes_.size()); }

}  // namespace distckpt
