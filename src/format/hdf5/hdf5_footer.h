// The footer distckpt appends to each HDF5 file it writes. HDF5's own checksums cover
// its newer structures only; the bytes it never reads again (the rest of a metadata
// block, space freed when an object header grew) and the older structures are unchecked,
// and a dataset's data is checked by its CRC32C in the "distckpt" attribute. The footer
// covers the rest: the CRC32C of every byte outside the datasets' data.
//
// 16 bytes past HDF5's end of file, which HDF5 (and h5py, h5dump) ignore: the magic
// "DCKPTH5F", u32 version 1, u32 CRC32C (little-endian) of every byte of the file before
// the CRC, the datasets' data excepted.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/filesystem.h"
#include "distckpt/status.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

inline constexpr uint64_t kHdf5FooterBytes = 16;

// Appends the footer to the closed HDF5 file `path`, whose datasets (the tensors of
// `meta`) start at `offsets` (Hdf5Writer::data_offsets). Not collective: the one process
// that finishes the file (rank 0 of a save) calls it, and it reads only the bytes outside
// the datasets' data. Fsyncs the file when asked. Fails with the file system's error.
Status append_hdf5_footer(FileSystem& fs, const std::string& path, const proto::Index& meta,
                          const std::vector<uint64_t>& offsets, bool fsync);

// Whether the file of `size` bytes ends with distckpt's footer (magic and version; its
// CRC unchecked). A file with it is one distckpt wrote: its metadata must record the
// datasets' checksums (a damaged attribute must not pass for another writer's file).
bool has_hdf5_footer(const ReadableFile& file, uint64_t size);

// Checks the footer of an HDF5 file of `size` bytes whose datasets `index` describes
// (hdf5_index: one chunk per dataset). kCorruption naming `path` when it is missing or
// its CRC32C differs; reads the bytes outside the datasets' data.
Status check_hdf5_footer(const ReadableFile& file, uint64_t size, const proto::Index& index, const std::string& path);

}  // namespace distckpt::internal_format
