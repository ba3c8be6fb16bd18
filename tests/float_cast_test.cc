// Float casts on load (LoadOptions::cast_floats): round to nearest even at every edge
// (ties, the largest finite values, subnormals), NaN and signed zeros kept, and every
// float16 and bfloat16 value round-tripping exactly through double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "transform/float_cast.h"

namespace distckpt::internal_transform {
namespace {

TEST(FloatCast, Bfloat16TiesGoToEven) {
  EXPECT_EQ(to_bfloat16_bits(1.0), 0x3F80);
  EXPECT_EQ(to_bfloat16_bits(1.0 + std::ldexp(1, -8)), 0x3F80);      // halfway to 0x3F81: even wins
  EXPECT_EQ(to_bfloat16_bits(1.0 + 3 * std::ldexp(1, -8)), 0x3F82);  // halfway 0x3F81..0x3F82: even
  EXPECT_EQ(to_bfloat16_bits(1.0 + std::ldexp(1, -8) + std::ldexp(1, -30)), 0x3F81);  // past halfway
  EXPECT_EQ(to_bfloat16_bits(-2.5), 0xC020);
  EXPECT_EQ(to_bfloat16_bits(-0.0), 0x8000);
  EXPECT_EQ(to_bfloat16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds past bf16's max
  EXPECT_EQ(to_bfloat16_bits(-std::numeric_limits<double>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(from_bfloat16_bits(to_bfloat16_bits(std::nan("")))));
  EXPECT_EQ(to_bfloat16_bits(-std::nan("")) & 0x8000, 0x8000);  // the sign of a NaN stays
}

TEST(FloatCast, Float16RangeAndSubnormals) {
  EXPECT_EQ(to_float16_bits(65504), 0x7BFF);  // the largest finite
  EXPECT_EQ(to_float16_bits(65519), 0x7BFF);  // below halfway to 65536
  EXPECT_EQ(to_float16_bits(65520), 0x7C00);  // halfway, and 65504 is odd: infinity
  EXPECT_EQ(to_float16_bits(std::ldexp(1, -24)), 0x0001);       // the smallest subnormal
  EXPECT_EQ(to_float16_bits(std::ldexp(1, -25)), 0x0000);       // halfway to it: even (zero)
  EXPECT_EQ(to_float16_bits(3 * std::ldexp(1, -26)), 0x0001);   // past halfway
  EXPECT_EQ(to_float16_bits(std::ldexp(1023.5, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(to_float16_bits(-std::ldexp(1, -30)), 0x8000);      // a signed zero
  EXPECT_EQ(from_float16_bits(0x3C00), 1.0);
  EXPECT_EQ(from_float16_bits(0x0001), std::ldexp(1, -24));
}

TEST(FloatCast, EveryHalfAndBfloat16ValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double h = from_float16_bits(bits), bf = from_bfloat16_bits(bits);
    if (std::isnan(h)) EXPECT_TRUE(std::isnan(from_float16_bits(to_float16_bits(h))));
    else EXPECT_EQ(to_float16_bits(h), bits) << std::hex << b;
    if (std::isnan(bf)) EXPECT_TRUE(std::isnan(from_bfloat16_bits(to_bfloat16_bits(bf))));
    else EXPECT_EQ(to_bfloat16_bits(bf), bits) << std::hex << b;
    // bfloat16 is float32's upper half: the same value.
    uint32_t f32 = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &f32, 4);
    if (!std::isnan(f)) EXPECT_EQ(bf, static_cast<double>(f));
  }
}

TEST(FloatCast, BuffersBetweenEveryPair) {
  const DType floats[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  const double values[] = {0.0, -0.0, 1.0, -3.5, 0.25, 1024.0, std::numeric_limits<double>::infinity()};
  for (DType from : floats)
    for (DType to : floats) {
      std::vector<unsigned char> src(sizeof values / sizeof values[0] * dtype_size(from));
      std::vector<unsigned char> dst(sizeof values / sizeof values[0] * dtype_size(to));
      std::vector<unsigned char> back(src.size());
      // Exact in every dtype: the values come back unchanged.
      std::vector<double> in(std::begin(values), std::end(values));
      cast_floats(in.data(), DType::kFloat64, src.data(), from, in.size());
      cast_floats(src.data(), from, dst.data(), to, in.size());
      std::vector<double> out(in.size());
      cast_floats(dst.data(), to, out.data(), DType::kFloat64, in.size());
      for (std::size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(out[i], in[i]) << dtype_name(from) << " -> " << dtype_name(to);
        EXPECT_EQ(std::signbit(out[i]), std::signbit(in[i]));
      }
    }
  // float64 -> float32 agrees with the hardware's rounding where that is defined, and
  // saturates to infinity beyond float's range (where a static_cast is undefined).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(-2, 2);
  std::uniform_int_distribution<int> exponent(-140, 120);
  for (int i = 0; i < 100000; ++i) {
    const double d = std::ldexp(mantissa(rng), exponent(rng));
    float f;
    cast_floats(&d, DType::kFloat64, &f, DType::kFloat32, 1);
    EXPECT_EQ(f, static_cast<float>(d)) << d;
  }
  const double huge = 1e300, tiny = 1e-300;
  float f;
  cast_floats(&huge, DType::kFloat64, &f, DType::kFloat32, 1);
  EXPECT_TRUE(std::isinf(f) && f > 0);
  cast_floats(&tiny, DType::kFloat64, &f, DType::kFloat32, 1);
  EXPECT_EQ(f, 0.0f);
}

}  // namespace
}  // namespace distckpt::internal_transform
