#include "base/test_seams.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

namespace distckpt::internal_base {

namespace {

std::optional<long long> env_number(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0') return std::nullopt;  // not a number: the seam stays off
  return value;
}

// splitmix64: a small, well-mixed sequence; not for secrets (the point is to repeat).
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

int64_t wall_clock_ms() {
  static const std::optional<long long> fixed = env_number("DISTCKPT_TEST_CLOCK_MS");
  if (fixed) return *fixed;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool seeded_random_bytes(void* out, std::size_t n) {
  static const std::optional<long long> seed = env_number("DISTCKPT_TEST_RANDOM_SEED");
  if (!seed) return false;
  static std::mutex mu;
  static uint64_t state = static_cast<uint64_t>(*seed);
  static bool warned = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!warned) {
    std::fprintf(stderr, "distckpt: DISTCKPT_TEST_RANDOM_SEED is set: salts and IVs are predictable (tests only)\n");
    warned = true;
  }
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; i += 8) {
    const uint64_t word = splitmix64(&state);
    std::memcpy(bytes + i, &word, n - i < 8 ? n - i : 8);
  }
  return true;
}

}  // namespace distckpt::internal_base
