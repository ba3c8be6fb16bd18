// The HDF5 reader program a consumer's package registered (distckpt/package.h:
// set_hdf5_reader_path, run before main). Kept here, at the lowest floor, because
// status.h brings the registration into every program; format/hdf5 reads it.
#pragma once

#include <string>

namespace distckpt::internal_base {

// The last path set_hdf5_reader_path registered, or "". Any thread.
std::string registered_hdf5_reader();

}  // namespace distckpt::internal_base
