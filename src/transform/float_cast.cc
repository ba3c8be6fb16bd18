#include "transform/float_cast.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace distckpt::internal_transform {
namespace {

// `x` (>= 0, below 2^53) rounded to an integer, ties to even. Done by hand: nearbyint
// follows the caller's rounding mode (fesetround), which must not change a checkpoint.
uint64_t round_half_even(double x) {
  const double floor = std::floor(x);
  auto q = static_cast<uint64_t>(floor);
  const double rest = x - floor;  // exact: both are multiples of x's last bit
  if (rest > 0.5 || (rest == 0.5 && (q & 1u))) ++q;
  return q;
}

// IEEE binary format with `exp_bits` exponent and `man_bits` stored mantissa bits, in
// the low bits of a uint32_t (float32, float16, bfloat16). Every step is exact in
// double (scaling by powers of two) except the one rounding.

uint32_t encode(double x, int exp_bits, int man_bits) {
  const uint32_t sign = std::signbit(x) ? 1u << (exp_bits + man_bits) : 0;
  const uint32_t exp_all = ((1u << exp_bits) - 1) << man_bits;
  if (std::isnan(x)) return sign | exp_all | (1u << (man_bits - 1));  // quiet NaN
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | exp_all;
  if (a == 0) return sign;
  const int bias = (1 << (exp_bits - 1)) - 1;
  int e = 0;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int unbiased = e - 1;     // a = s * 2^unbiased, s in [1, 2)
  if (unbiased < 1 - bias) {
    // Subnormal: a multiple of 2^(1 - bias - man_bits). Rounding up to 2^man_bits gives
    // the smallest normal number, whose bits follow on directly.
    const auto q = static_cast<uint32_t>(round_half_even(std::ldexp(a, bias - 1 + man_bits)));
    return sign | q;
  }
  auto q = static_cast<uint32_t>(round_half_even(std::ldexp(a, man_bits - unbiased)));  // in [2^m, 2^(m+1)]
  if (q == (1u << (man_bits + 1))) {
    q >>= 1;
    ++unbiased;
  }
  if (unbiased > bias) return sign | exp_all;  // beyond the range: infinity
  return sign | (static_cast<uint32_t>(unbiased + bias) << man_bits) | (q & ((1u << man_bits) - 1));
}

// Decoded from the bits, not by the FPU: a float32 subnormal must not become 0 where the
// caller runs with denormals-are-zero (as torch.set_flush_denormal sets).
double decode(uint32_t bits, int exp_bits, int man_bits) {
  const bool negative = (bits >> (exp_bits + man_bits)) & 1u;
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (exp == (1u << exp_bits) - 1) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  else v = std::ldexp(static_cast<double>(man | (1u << man_bits)), static_cast<int>(exp) - bias - man_bits);
  return negative ? -v : v;
}

double load_one(const unsigned char* p, DType t) {
  switch (t) {
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat32: {
      uint32_t bits;
      std::memcpy(&bits, p, sizeof bits);
      return decode(bits, 8, 23);
    }
    default: {
      uint16_t b;
      std::memcpy(&b, p, sizeof b);
      return t == DType::kFloat16 ? from_float16_bits(b) : from_bfloat16_bits(b);
    }
  }
}

void store_one(double v, unsigned char* p, DType t) {
  switch (t) {
    case DType::kFloat64:
      std::memcpy(p, &v, sizeof v);
      return;
    case DType::kFloat32: {
      // Not static_cast<float>: a double beyond float's range is undefined behaviour there.
      const uint32_t bits = encode(v, 8, 23);
      std::memcpy(p, &bits, sizeof bits);
      return;
    }
    default: {
      const uint16_t b = t == DType::kFloat16 ? to_float16_bits(v) : to_bfloat16_bits(v);
      std::memcpy(p, &b, sizeof b);
      return;
    }
  }
}

}  // namespace

bool is_floating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}

uint16_t to_float16_bits(double x) { return static_cast<uint16_t>(encode(x, 5, 10)); }
uint16_t to_bfloat16_bits(double x) { return static_cast<uint16_t>(encode(x, 8, 7)); }
double from_float16_bits(uint16_t bits) { return decode(bits, 5, 10); }
double from_bfloat16_bits(uint16_t bits) { return decode(bits, 8, 7); }

void cast_floats(const void* src, DType from, void* dst, DType to, std::size_t count) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t in_size = dtype_size(from), out_size = dtype_size(to);
  // Every float16, bfloat16 and float32 value is exact in double, so going through
  // double rounds once, at the store.
  for (std::size_t i = 0; i < count; ++i) store_one(load_one(in + i * in_size, from), out + i * out_size, to);
}

}  // namespace distckpt::internal_transform
