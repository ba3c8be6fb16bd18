#include "base/text.h"

#include <cstdio>

namespace distckpt::internal_base {
namespace {

// Length of the UTF-8 sequence starting at s[i], or 0 if it is malformed.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// Whether the sequence of length n at s[i] is a C1 control (U+0080-U+009F, UTF-8 C2 80
// to C2 9F): some terminals take U+009B as the escape that starts a control sequence.
bool is_c1_control(std::string_view s, std::size_t i, std::size_t n) {
  return n == 2 && static_cast<unsigned char>(s[i]) == 0xC2 && static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool is_printable_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F)) || is_c1_control(s, i, n)) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
      ++i;
    } else if (is_c1_control(s, i, n)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(s[i + 1]));
      out += buf;
      i += n;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace distckpt::internal_base
