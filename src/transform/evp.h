// OpenSSL EVP helpers shared by the checkpoint cipher (cipher.h) and MindSpore's
// framing (ms_framing.h). Internal to the transform floor.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <string>

#include "distckpt/encryption.h"
#include "distckpt/status.h"

namespace distckpt::internal_transform {

// The EVP cipher of `mode` for a key of `key_bytes` (16/24/32 AES, 16 SM4); null for
// kNone. Any thread.
const EVP_CIPHER* evp_cipher(EncryptionMode mode, std::size_t key_bytes);

// Initializes `ctx` (null: kInternal, as OpenSSL could not allocate it) for `mode` with
// `key` (key_bytes of it) and `iv` (GCM: any length, set first); CBC pads with PKCS#7
// when `padding`. kInternal naming the OpenSSL call that failed.
Status init_evp(EVP_CIPHER_CTX* ctx, bool encrypt, EncryptionMode mode, std::size_t key_bytes, const std::string& key,
                const std::string& iv, bool padding);

// kInternal naming the OpenSSL call that failed.
Status openssl_error(const std::string& what);

// An EVP_CIPHER_CTX freed with its owner (its ctx is null if OpenSSL could not allocate).
struct CipherCtx {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  CipherCtx() = default;
  CipherCtx(const CipherCtx&) = delete;
  CipherCtx& operator=(const CipherCtx&) = delete;
  ~CipherCtx() { EVP_CIPHER_CTX_free(ctx); }
};

}  // namespace distckpt::internal_transform
