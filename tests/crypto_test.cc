// Encryption primitives: keys from files and the environment, sealing and opening
// chunks in every mode (round trips at block edges, tampering, wrong keys, another
// chunk's identity), and the sealed tensor table of an index.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "distckpt/encryption.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "format/format.h"
#include "tools/inspect.h"
#include "test_util.h"
#include "transform/cipher.h"

namespace distckpt {
namespace {

using internal_transform::CheckpointCipher;
using internal_transform::chunk_aad;

std::string bytes_of(std::size_t n, int seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + static_cast<std::size_t>(seed) * 7) & 0xff);
  return s;
}

EncryptionKey key_of(std::size_t n, int seed = 1) { return *EncryptionKey::from_bytes(bytes_of(n, seed)); }

std::shared_ptr<const CheckpointCipher> cipher_of(EncryptionMode mode, const EncryptionKey& key,
                                                  const std::string& salt = std::string(16, 's')) {
  auto c = CheckpointCipher::create(mode, key, salt);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : nullptr;
}

// Seals `plain` in uneven pieces, as the writers feed it.
std::string seal(const CheckpointCipher& c, const std::string& nonce, const std::string& aad, const std::string& plain,
                 std::string* tag) {
  auto sealer = c.begin_seal(nonce, aad);
  EXPECT_TRUE(sealer.ok()) << sealer.status().to_string();
  std::string out;
  std::vector<char> buf(plain.size() + 64);
  for (std::size_t done = 0, step = 1; done < plain.size(); step = step * 3 + 1) {
    const std::size_t n = std::min(step, plain.size() - done);
    std::size_t produced = 0;
    EXPECT_TRUE(sealer->update(plain.data() + done, n, buf.data(), &produced).ok());
    out.append(buf.data(), produced);
    done += n;
  }
  std::size_t produced = 0;
  EXPECT_TRUE(sealer->finish(buf.data(), &produced, tag).ok());
  out.append(buf.data(), produced);
  return out;
}

class ChunkModes : public ::testing::TestWithParam<std::tuple<EncryptionMode, std::size_t>> {};

TEST_P(ChunkModes, RoundTripsAndRefusesEveryChange) {
  const auto [mode, key_bytes] = GetParam();
  const EncryptionKey key = key_of(key_bytes);
  auto c = cipher_of(mode, key);
  ASSERT_TRUE(c);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                        std::size_t{4096}, std::size_t{(1 << 20) + 3}}) {
    SCOPED_TRACE("plain bytes " + std::to_string(n));
    const std::string plain = bytes_of(n, static_cast<int>(n));
    const std::string nonce = c->chunk_nonce(3, 7);
    EXPECT_EQ(nonce.size(), c->nonce_bytes());
    const std::string aad = chunk_aad("w", 7, "data-00001.bin", 4096, c->stored_length(n), n);
    std::string tag;
    const std::string sealed = seal(*c, nonce, aad, plain, &tag);
    ASSERT_EQ(sealed.size(), c->stored_length(n));
    EXPECT_EQ(tag.size(), c->tag_bytes());
    if (n >= 16) EXPECT_EQ(sealed.find(plain.substr(0, 16)), std::string::npos) << "plaintext visible";

    std::string out(n, '\0');
    ASSERT_TRUE(c->open(nonce, aad, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7").ok());
    EXPECT_EQ(out, plain);
    // In place, as load decrypts GCM chunks in the caller's buffer.
    std::string inplace = sealed;
    ASSERT_TRUE(c->open(nonce, aad, inplace.data(), inplace.size(), inplace.data(), n, tag, "chunk 7").ok());
    EXPECT_EQ(inplace.substr(0, n), plain);

    auto refused = [&](const std::string& what, const Status& st) {
      EXPECT_EQ(st.code(), StatusCode::kAuthFailed) << what << ": " << st.to_string();
      EXPECT_NE(st.message().find("chunk 7"), std::string::npos) << st.message();
    };
    if (!sealed.empty()) {
      std::string flipped = sealed;
      flipped[flipped.size() / 2] ^= 0x01;
      refused("a flipped bit", c->open(nonce, aad, flipped.data(), flipped.size(), out.data(), n, tag, "chunk 7"));
    }
    std::string bad_tag = tag;
    bad_tag[0] ^= 0x80;
    refused("a changed tag", c->open(nonce, aad, sealed.data(), sealed.size(), out.data(), n, bad_tag, "chunk 7"));
    refused("another nonce",
            c->open(c->chunk_nonce(3, 8), aad, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7"));
    const std::string moved = chunk_aad("w", 7, "data-00001.bin", 8192, c->stored_length(n), n);
    refused("another offset", c->open(nonce, moved, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7"));
    const std::string other = chunk_aad("v", 7, "data-00001.bin", 4096, c->stored_length(n), n);
    refused("another tensor", c->open(nonce, other, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7"));
    auto wrong = cipher_of(mode, key_of(key_bytes, 2));
    refused("a wrong key", wrong->open(nonce, aad, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7"));
    auto other_salt = cipher_of(mode, key, std::string(16, 't'));
    refused("another checkpoint's keys",
            other_salt->open(nonce, aad, sealed.data(), sealed.size(), out.data(), n, tag, "chunk 7"));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ChunkModes,
                         ::testing::Values(std::make_tuple(EncryptionMode::kAesGcm, std::size_t{32}),
                                           std::make_tuple(EncryptionMode::kAesGcm, std::size_t{16}),
                                           std::make_tuple(EncryptionMode::kAesGcm, std::size_t{24}),
                                           std::make_tuple(EncryptionMode::kAesCbc, std::size_t{32}),
                                           std::make_tuple(EncryptionMode::kAesCbc, std::size_t{16}),
                                           std::make_tuple(EncryptionMode::kSm4Cbc, std::size_t{16})));

TEST(Cipher, NamesLengthsAndNonces) {
  EXPECT_EQ(cipher_of(EncryptionMode::kAesGcm, key_of(32))->algorithm(), "AES-256-GCM");
  EXPECT_EQ(cipher_of(EncryptionMode::kAesGcm, key_of(16))->algorithm(), "AES-128-GCM");
  EXPECT_EQ(cipher_of(EncryptionMode::kAesCbc, key_of(24))->algorithm(), "AES-192-CBC-HMAC-SHA256");
  EXPECT_EQ(cipher_of(EncryptionMode::kSm4Cbc, key_of(16))->algorithm(), "SM4-CBC-HMAC-SHA256");
  auto cbc = cipher_of(EncryptionMode::kAesCbc, key_of(32));
  EXPECT_EQ(cbc->stored_length(0), 16u);
  EXPECT_EQ(cbc->stored_length(15), 16u);
  EXPECT_EQ(cbc->stored_length(16), 32u);
  EXPECT_EQ(cipher_of(EncryptionMode::kAesGcm, key_of(32))->stored_length(17), 17u);
  // Nonces: distinct per (tensor, chunk); CBC IVs are not the counter itself.
  std::set<std::string> seen;
  for (uint32_t t = 0; t < 20; ++t)
    for (uint64_t c = 0; c < 20; ++c) EXPECT_TRUE(seen.insert(cbc->chunk_nonce(t, c)).second);
  EXPECT_NE(cbc->chunk_nonce(0, 0), std::string(16, '\0'));
  // SM4 takes 16-byte keys only; a salt has 16 bytes.
  EXPECT_EQ(CheckpointCipher::create(EncryptionMode::kSm4Cbc, key_of(32), std::string(16, 's')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckpointCipher::create(EncryptionMode::kAesGcm, key_of(32), "short").ok());
  EXPECT_FALSE(CheckpointCipher::create(EncryptionMode::kNone, key_of(32), std::string(16, 's')).ok());
  auto a = CheckpointCipher::random_bytes(16), b = CheckpointCipher::random_bytes(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

TEST(Cipher, ModeNames) {
  EXPECT_EQ(encryption_mode_from_name("aes-gcm"), EncryptionMode::kAesGcm);
  EXPECT_EQ(encryption_mode_from_name("AES-CBC"), EncryptionMode::kAesCbc);
  EXPECT_EQ(encryption_mode_from_name("SM4-cbc"), EncryptionMode::kSm4Cbc);
  EXPECT_EQ(encryption_mode_from_name("none"), EncryptionMode::kNone);
  EXPECT_FALSE(encryption_mode_from_name("AES-CTR"));
  EXPECT_EQ(encryption_mode_name(EncryptionMode::kSm4Cbc), "SM4-CBC");
}

TEST(Keys, FromBytesFilesAndEnvironment) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path() + "/" + name, std::ios::binary) << content;
    return dir.path() + "/" + name;
  };
  const std::string raw = bytes_of(32, 9);
  auto from_raw = EncryptionKey::from_file(write("raw", raw));
  ASSERT_TRUE(from_raw.ok()) << from_raw.status().to_string();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(from_raw->data()), from_raw->size()), raw);
  // Hex with a newline (openssl rand -hex 16), upper or lower case.
  auto from_hex = EncryptionKey::from_file(write("hex", "00112233445566778899AABBccddeeff\n"));
  ASSERT_TRUE(from_hex.ok()) << from_hex.status().to_string();
  ASSERT_EQ(from_hex->size(), 16u);
  EXPECT_EQ(from_hex->data()[0], 0x00);
  EXPECT_EQ(from_hex->data()[10], 0xaa);
  EXPECT_EQ(from_hex->data()[15], 0xff);
  EXPECT_EQ(EncryptionKey::from_file(write("short", "0123456789")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncryptionKey::from_file(write("long", std::string(33, 'x'))).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncryptionKey::from_file(write("badhex", std::string(63, 'a') + "g")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncryptionKey::from_file(dir.path() + "/missing").status().code(), StatusCode::kNotFound);
  // The message about a bad key file never carries its bytes.
  const Status bad = EncryptionKey::from_file(write("secret", "SECRET-KEY-MATERIAL")).status();
  EXPECT_EQ(bad.message().find("SECRET"), std::string::npos) << bad.message();

  ::setenv("DISTCKPT_TEST_KEY", std::string(64, 'e').c_str(), 1);
  auto from_env = EncryptionKey::from_env("DISTCKPT_TEST_KEY");
  ASSERT_TRUE(from_env.ok()) << from_env.status().to_string();
  EXPECT_EQ(from_env->size(), 32u);
  EXPECT_EQ(from_env->data()[31], 0xee);
  ::setenv("DISTCKPT_TEST_KEY", "not-hex-at-all-not-hex-at-all-xx", 1);
  const Status env_bad = EncryptionKey::from_env("DISTCKPT_TEST_KEY").status();
  EXPECT_EQ(env_bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_bad.message().find("not-hex"), std::string::npos) << env_bad.message();
  ::unsetenv("DISTCKPT_TEST_KEY");
  EXPECT_EQ(EncryptionKey::from_env("DISTCKPT_TEST_KEY").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(EncryptionKey::from_bytes("12345").status().code(), StatusCode::kInvalidArgument);
}

// The index: tensors sealed, the rest readable and authenticated with them.
proto::Index small_index() {
  proto::Index index;
  index.set_name("step-1");
  index.set_step(1);
  index.set_world_size(1);
  index.set_format("native");
  index.mutable_transforms()->set_checksum("crc32c");
  auto* f = index.add_files();
  f->set_name("data-00000.bin");
  f->set_size(64);
  auto* t = index.add_tensors();
  t->set_name("secret.weight");
  t->set_dtype("float32");
  t->add_global_shape(4);
  auto* c = t->add_chunks();
  c->add_offset(0);
  c->add_shape(4);
  c->set_length(16);
  return index;
}

TEST(SealedIndex, OnlyTheKeyOpensItAndNothingCanBeChanged) {
  for (EncryptionMode mode : {EncryptionMode::kAesGcm, EncryptionMode::kAesCbc, EncryptionMode::kSm4Cbc}) {
    SCOPED_TRACE(std::string(encryption_mode_name(mode)));
    const EncryptionKey key = key_of(16);
    const std::string salt = *CheckpointCipher::random_bytes(16);
    auto c = cipher_of(mode, key, salt);
    proto::Index index = small_index();
    // Chunk lengths and nonces as an encrypted save records them.
    auto* chunk = index.mutable_tensors(0)->mutable_chunks(0);
    chunk->set_length(c->stored_length(16));
    chunk->set_nonce(c->chunk_nonce(0, 0));
    chunk->set_tag(std::string(c->tag_bytes(), 't'));
    ASSERT_TRUE(internal_format::seal_index(&index, *c, salt).ok());
    EXPECT_EQ(index.tensors_size(), 0);
    const std::string framed = internal_format::frame_index(index);
    EXPECT_EQ(framed.find("secret.weight"), std::string::npos) << "a tensor name is readable";

    // Without a key: parses (listing, retention), but tensors stay sealed.
    auto parsed = internal_format::parse_index(framed, "ck/index.pb");
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_EQ(parsed->step(), 1);
    const CheckpointInfo info = internal_tools::to_checkpoint_info(*parsed, "ck");
    EXPECT_TRUE(info.tensors_sealed);
    EXPECT_EQ(info.encryption, c->algorithm());
    proto::Index no_key = *parsed;
    EXPECT_EQ(internal_format::open_index(&no_key, nullptr, "ck").status().code(), StatusCode::kAuthFailed);

    proto::Index opened = *parsed;
    auto cipher = internal_format::open_index(&opened, &key, "ck");
    ASSERT_TRUE(cipher.ok()) << cipher.status().to_string();
    ASSERT_EQ(opened.tensors_size(), 1);
    EXPECT_EQ(opened.tensors(0).name(), "secret.weight");

    proto::Index wrong = *parsed;
    const EncryptionKey other = key_of(16, 5);
    EXPECT_EQ(internal_format::open_index(&wrong, &other, "ck").status().code(), StatusCode::kAuthFailed);
    // The readable part is authenticated too: a changed step, file size or info value.
    for (int change = 0; change < 3; ++change) {
      proto::Index changed = *parsed;
      if (change == 0) changed.set_step(2);
      if (change == 1) changed.mutable_files(0)->set_size(65);
      if (change == 2) (*changed.mutable_info())["loss"].set_float_value(0.1);
      const Status st = internal_format::open_index(&changed, &key, "ck").status();
      EXPECT_EQ(st.code(), StatusCode::kAuthFailed) << change << ": " << st.to_string();
    }
  }
}

TEST(SealedIndex, EmptyTablesOpenAndPlainIndexesAreRefusedWithAKey) {
  const EncryptionKey key = key_of(32);
  for (EncryptionMode mode : {EncryptionMode::kAesGcm, EncryptionMode::kAesCbc}) {
    const std::string salt = *CheckpointCipher::random_bytes(16);
    auto c = cipher_of(mode, key, salt);
    proto::Index index = small_index();
    index.clear_tensors();  // an info-only state dict: an empty table (GCM: zero sealed bytes)
    ASSERT_TRUE(internal_format::seal_index(&index, *c, salt).ok());
    auto parsed = internal_format::parse_index(internal_format::frame_index(index), "ck/index.pb");
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    auto opened = internal_format::open_index(&*parsed, &key, "ck");
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  }
  // A reader holding a key refuses a plain index in an encrypted one's place.
  proto::Index plain = small_index();
  const Status st = internal_format::open_index(&plain, &key, "ck").status();
  EXPECT_EQ(st.code(), StatusCode::kAuthFailed) << st.to_string();
  EXPECT_NE(st.message().find("not encrypted"), std::string::npos) << st.to_string();
  proto::Index no_key = small_index();
  auto none = internal_format::open_index(&no_key, nullptr, "ck");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  // A key of another length than the checkpoint's: the wrong key, said as such.
  const std::string salt = *CheckpointCipher::random_bytes(16);
  proto::Index index = small_index();
  auto* chunk = index.mutable_tensors(0)->mutable_chunks(0);
  auto c = cipher_of(EncryptionMode::kAesGcm, key, salt);
  chunk->set_nonce(c->chunk_nonce(0, 0));
  chunk->set_tag(std::string(16, 't'));
  ASSERT_TRUE(internal_format::seal_index(&index, *c, salt).ok());
  const EncryptionKey short_key = key_of(16);
  EXPECT_EQ(internal_format::open_index(&index, &short_key, "ck").status().code(), StatusCode::kAuthFailed);
  // An index.pb claiming to be a single file (whose seal is checked another way), or
  // carrying a single file's seal material: refused before any key is used.
  proto::Index flipped = index;
  flipped.set_format("ckpt");
  EXPECT_EQ(internal_format::parse_index(internal_format::frame_index(flipped), "ck").status().code(),
            StatusCode::kCorruption);
  proto::Index replayed = index;
  replayed.mutable_encryption()->set_associated("a .ckpt's sealed metadata");
  EXPECT_EQ(internal_format::parse_index(internal_format::frame_index(replayed), "ck").status().code(),
            StatusCode::kCorruption);
  // An encrypted index framed as version 1 (readers of version 1 would see no tensors).
  const std::string framed = internal_format::frame_payload(internal_format::serialize_deterministic(index), 1);
  EXPECT_EQ(internal_format::parse_index(framed, "ck").status().code(), StatusCode::kCorruption);
}

TEST(SealedIndex, BadEncryptionRecordsAreCorruption) {
  proto::Index index = small_index();
  index.mutable_encryption()->set_mode("ROT13");
  EXPECT_EQ(internal_format::validate_index(index, "ck").code(), StatusCode::kCorruption);
  index = small_index();
  index.mutable_transforms()->set_encryption("AES-256-GCM");  // claims encryption, has no parameters
  EXPECT_EQ(internal_format::validate_index(index, "ck").code(), StatusCode::kCorruption);
  index = small_index();
  index.mutable_tensors(0)->mutable_chunks(0)->set_tag("x");  // a tag in a plain checkpoint
  EXPECT_EQ(internal_format::validate_index(index, "ck").code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace distckpt
