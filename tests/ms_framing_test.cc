// MindSpore's encrypted-file framing (transform/ms_framing.h) and the files that present
// it as plaintext (format/ckpt/framed_file.h): round trips over a block boundary in every
// mode, hostile headers, truncation, a wrong key, modified bytes, an early 1.x file.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "format/ckpt/framed_file.h"
#include "test_util.h"
#include "transform/ms_framing.h"

namespace distckpt {
namespace {

using internal_transform::kMsMaxBlockPlain;
using testing::TempDir;
using internal_transform::MsBlockHeader;
using internal_transform::parse_ms_block_header;

std::shared_ptr<const EncryptionKey> key_of(std::size_t n, char fill) {
  return std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(n, fill)));
}

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  return s;
}

// Writes `plain` through the framing in uneven pieces; returns the file's path.
std::string write_framed(const TempDir& dir, const std::string& name, const std::string& plain, EncryptionMode mode,
                         const EncryptionKey& key) {
  const std::string path = dir.path() + "/" + name;
  auto base = posix_filesystem()->open_writable(path);
  EXPECT_TRUE(base.ok()) << base.status().to_string();
  auto file = internal_format::framed_writable(std::move(*base), mode, key);
  EXPECT_TRUE(file.ok()) << file.status().to_string();
  uint64_t at = 0;
  for (std::size_t piece = 1; at < plain.size(); piece = piece * 7 + 3) {
    const std::size_t n = std::min<std::size_t>(piece % (9u << 20), plain.size() - at);
    EXPECT_TRUE((*file)->write_at(plain.data() + at, n, at).ok());
    at += n;
  }
  EXPECT_EQ((*file)->write_at("x", 1, 0).code(), StatusCode::kInternal);  // only at the end
  EXPECT_TRUE((*file)->sync().ok());
  EXPECT_TRUE((*file)->close().ok());
  return path;
}

std::string read_raw(const std::string& path) {
  auto s = read_whole_file(*posix_filesystem(), path);
  EXPECT_TRUE(s.ok());
  return *s;
}
void write_raw(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(write_file_synced(*posix_filesystem(), path, bytes).ok());
}

class FramedModes : public ::testing::TestWithParam<std::pair<EncryptionMode, std::size_t>> {};

TEST_P(FramedModes, RoundTripOverABlockBoundary) {
  TempDir dir;
  const auto [mode, key_bytes] = GetParam();
  const auto key = key_of(key_bytes, 'k');
  const std::string plain = pattern(kMsMaxBlockPlain + 4097);
  const std::string path = write_framed(dir, "a.ckpt", plain, mode, *key);
  const std::string stored = read_raw(path);
  EXPECT_EQ(internal_format::framed_mode(stored), mode);
  EXPECT_EQ(stored.find(plain.substr(1000, 32)), std::string::npos);  // no plaintext run

  auto fs = internal_format::with_key(posix_filesystem(), key.get());
  auto size = fs->file_size(path);
  ASSERT_TRUE(size.ok()) << size.status().to_string();
  EXPECT_EQ(*size, plain.size());
  auto file = fs->open_readable(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const auto info = internal_format::framing_of(**file);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->blocks, 2u);
  EXPECT_EQ(info->stored_size, stored.size());
  // Across the boundary, then back into the first block (the cache holds one).
  std::string got(9000, '\0');
  const Status across = (*file)->read_at(got.data(), got.size(), kMsMaxBlockPlain - 5000);
  ASSERT_TRUE(across.ok()) << across.to_string();
  EXPECT_EQ(got, plain.substr(kMsMaxBlockPlain - 5000, 9000));
  ASSERT_TRUE((*file)->read_at(got.data(), 100, 7).ok());
  EXPECT_EQ(got.substr(0, 100), plain.substr(7, 100));
  EXPECT_EQ((*file)->read_at(got.data(), 2, plain.size() - 1).code(), StatusCode::kCorruption);
  if (mode == EncryptionMode::kAesGcm) {
    // A changed byte of the second block is damage (the first authenticates with this
    // key); the same read with a wrong key fails authentication.
    std::string changed = stored;
    changed[stored.size() - 100] ^= 0x04;
    write_raw(path, changed);
    auto damaged = fs->open_readable(path);
    ASSERT_TRUE(damaged.ok()) << damaged.status().to_string();
    const Status st = (*damaged)->read_at(got.data(), 100, plain.size() - 200);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
    auto wrong = internal_format::with_key(posix_filesystem(), key_of(key_bytes, 'w').get())->open_readable(path);
    ASSERT_TRUE(wrong.ok());
    EXPECT_EQ((*wrong)->read_at(got.data(), 100, plain.size() - 200).code(), StatusCode::kAuthFailed);
  }
  // Files not named .ckpt, and plain files, are the base file system's.
  write_raw(dir.path() + "/plain.ckpt", plain.substr(0, 100));
  EXPECT_EQ(*fs->file_size(dir.path() + "/plain.ckpt"), 100u);
  EXPECT_FALSE(internal_format::framing_of(**fs->open_readable(dir.path() + "/plain.ckpt")).has_value());
}

INSTANTIATE_TEST_SUITE_P(Modes, FramedModes,
                         ::testing::Values(std::make_pair(EncryptionMode::kAesGcm, 32),
                                           std::make_pair(EncryptionMode::kAesGcm, 16),
                                           std::make_pair(EncryptionMode::kAesCbc, 24),
                                           std::make_pair(EncryptionMode::kSm4Cbc, 16)));

// One open file read from several threads at once (a load's reader threads): each read
// decrypts the blocks it needs under the file's lock and gets its own bytes.
TEST(MsFramingTest, ConcurrentReadsOfOneFileGetTheirOwnBytes) {
  TempDir dir;
  const auto key = key_of(32, 'k');
  const std::string plain = pattern(kMsMaxBlockPlain + (1 << 20));
  const std::string path = write_framed(dir, "c.ckpt", plain, EncryptionMode::kAesGcm, *key);
  auto file = internal_format::with_key(posix_filesystem(), key.get())->open_readable(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::string got(4096, '\0');
      for (int i = 0; i < 40; ++i) {
        // Alternating between the two blocks, so that the one cached block keeps changing.
        const uint64_t at = (i + t) % 2 == 0 ? 4096u * static_cast<uint64_t>(i + t) : kMsMaxBlockPlain + 512u * i;
        if (!(*file)->read_at(got.data(), got.size(), at).ok() || got != plain.substr(at, got.size())) ++bad[t];
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(MsFramingTest, HostileHeadersAreRefusedBeforeAnyAllocation) {
  MsBlockHeader h{EncryptionMode::kAesGcm, std::string(16, 't'), std::string(16, 'i'), 1000};
  const std::string good = internal_transform::ms_block_header(h);
  ASSERT_EQ(good.size(), 48u);
  EXPECT_TRUE(parse_ms_block_header(EncryptionMode::kAesGcm, good, 0, 48 + 1000, "f").ok());
  auto with = [&](std::size_t at, uint32_t v) {
    std::string b = good;
    std::memcpy(b.data() + at, &v, 4);  // little-endian hosts, as MindSpore's files
    return b;
  };
  auto code = [](const Result<MsBlockHeader>& r) { return r.status().code(); };
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, good, 0, 48 + 999, "f")), StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, good.substr(0, 40), 0, 40, "f")),
            StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesCbc, good, 0, 2000, "f")), StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, with(24, 12), 0, 2000, "f")), StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, with(20, 999), 0, 2000, "f")), StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, with(44, 0), 0, 2000, "f")), StatusCode::kCorruption);
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesGcm, with(44, 0xFFFFFFF0u), 0, uint64_t{1} << 40, "f")),
            StatusCode::kCorruption);
  MsBlockHeader c{EncryptionMode::kAesCbc, "", std::string(16, 'i'), 1001};  // not whole CBC blocks
  EXPECT_EQ(code(parse_ms_block_header(EncryptionMode::kAesCbc, internal_transform::ms_block_header(c), 0, 5000, "f")),
            StatusCode::kCorruption);
  // Early 1.x: the GCM magic, then block_size and iv_len 16, no tag.
  std::string early = with(0, 0x7F3A5ED8u).substr(0, 4);
  early += std::string("\x1C\x04\x00\x00\x10\x00\x00\x00", 8) + std::string(36, 'x');
  const auto refused = parse_ms_block_header(EncryptionMode::kAesGcm, early, 0, 5000, "f");
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find("1.x"), std::string::npos) << refused.status().to_string();
}

TEST(MsFramingTest, WrongKeysTruncationAndModifiedBytesFail) {
  TempDir dir;
  const auto key = key_of(32, 'k');
  const std::string plain = pattern(5000);
  const std::string path = write_framed(dir, "g.ckpt", plain, EncryptionMode::kAesGcm, *key);
  const std::string stored = read_raw(path);
  std::string got(plain.size(), '\0');
  auto read_with = [&](const EncryptionKey& k) -> Status {
    auto file = internal_format::with_key(posix_filesystem(), &k)->open_readable(path);
    if (!file.ok()) return file.status();
    return (*file)->read_at(got.data(), got.size(), 0);
  };
  ASSERT_TRUE(read_with(*key).ok());
  EXPECT_EQ(got, plain);
  EXPECT_EQ(read_with(*key_of(32, 'w')).code(), StatusCode::kAuthFailed);
  EXPECT_EQ(read_with(*key_of(16, 'k')).code(), StatusCode::kAuthFailed);  // AES-128 cannot be its key either
  std::string changed = stored;
  changed[stored.size() - 10] ^= 0x20;
  write_raw(path, changed);
  EXPECT_EQ(read_with(*key).code(), StatusCode::kAuthFailed);
  write_raw(path, stored.substr(0, stored.size() - 1));
  EXPECT_EQ(read_with(*key).code(), StatusCode::kCorruption);
  write_raw(path, stored + stored.substr(0, 10));  // a second block cut short
  EXPECT_EQ(read_with(*key).code(), StatusCode::kCorruption);
  // SM4 takes 16-byte keys only.
  auto base = posix_filesystem()->open_writable(dir.path() + "/s.ckpt");
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(internal_format::framed_writable(std::move(*base), EncryptionMode::kSm4Cbc, *key).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace distckpt
