/// Where an installed distckpt's helper program is, for programs built against it.
///
/// Reading an HDF5 file starts distckpt-hdf5-reader (libexec/distckpt/ of the install), so
/// that libhdf5 parses untrusted files in a process of its own. A program built with
/// find_package(distckpt) registers, before main, the reader of the install it was built
/// against, wherever that install was moved since (its CMake package defines
/// DISTCKPT_PACKAGE_HDF5_READER from its own location).
#pragma once

#include <string>

namespace distckpt {

/// Where reads of HDF5 files look for distckpt-hdf5-reader when the environment variable
/// DISTCKPT_HDF5_READER is unset, before the places the library knows (beside the
/// running program's bin/, the build tree, the configured install). Any thread; the last
/// call wins; cannot fail (a path that is not an executable program, owned by root or the
/// user and not writable by others, is passed over when a read looks).
void set_hdf5_reader_path(const std::string& path);

/// The reader program a read of an HDF5 file would start now, or "" when none is found
/// (the read then fails with kNotFound listing every place tried). Any thread; local.
std::string hdf5_reader_program();

#ifdef DISTCKPT_PACKAGE_HDF5_READER
namespace package_detail {
/// Initialized before main in every translation unit that includes this header (all with
/// the same path). Internal linkage, so that every such unit runs it: an unused inline
/// variable's initialization may never be emitted.
[[maybe_unused]] static const bool hdf5_reader_registered =
    (set_hdf5_reader_path(DISTCKPT_PACKAGE_HDF5_READER), true);
}  // namespace package_detail
#endif

}  // namespace distckpt
