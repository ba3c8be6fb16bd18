// Conversions between the floating dtypes (float16, bfloat16, float32, float64) for a
// load that asks for them (LoadOptions::cast_floats): round to nearest, ties to even,
// as IEEE 754's default; NaN stays NaN (quiet, with its sign), infinities and signed
// zeros are kept; values beyond the target's range become infinities, values below its
// smallest subnormal round to zero or to it. Integer and bool dtypes are never cast.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distckpt/dtype.h"

namespace distckpt::internal_transform {

bool is_floating(DType t);

// The nearest float16 / bfloat16 to `x` (ties to even), as raw bits.
uint16_t to_float16_bits(double x);
uint16_t to_bfloat16_bits(double x);
// The exact value of a float16 / bfloat16.
double from_float16_bits(uint16_t bits);
double from_bfloat16_bits(uint16_t bits);

// Converts `count` elements from `src` (dtype `from`) to `dst` (dtype `to`); both
// floating (precondition), the buffers must not overlap.
void cast_floats(const void* src, DType from, void* dst, DType to, std::size_t count);

}  // namespace distckpt::internal_transform
