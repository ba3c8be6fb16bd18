// Loads that cannot read straight into the caller's memory read a box into a packed
// staging buffer first: a cast (LoadOptions::cast_floats: read in the stored dtype) or
// a strided buffer (StateDict's Strides). Once every read succeeded, write_back puts
// each staged box into the caller's memory. Shared by load and the local tier's restore.
#pragma once

#include <cstddef>

#include "distckpt/dtype.h"
#include "distckpt/state_dict.h"

namespace distckpt::internal_plan {

// Whether box reads of `e` must be staged when they arrive in dtype `read`.
inline bool needs_staging(const TensorEntry& e, DType read) { return read != e.dtype || e.strided(); }

// Converts box `b` of `e` from the packed staging buffer `staged` (elements of dtype
// `from`: floating when it differs from e.dtype) into e's buffer for that box, through
// its strides. Local, any thread; cannot fail (strides checked by
// internal_layout::check_writable before any read).
void write_back(const TensorEntry& e, std::size_t b, const void* staged, DType from);

}  // namespace distckpt::internal_plan
