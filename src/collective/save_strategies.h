// The write strategies of single-file (and integrated native) saves, each on the save
// frame (save_frame.h). save() (save.cc) picks one; the sharded strategy is save.cc's.
#pragma once

#include <string>

#include "collective/save_frame.h"

namespace distckpt::internal_collective {

// Collective. Checks that the ranks share the single-file options, then writes with
// save_gathered (ckpt, safetensors, native + integrated) or save_hdf5.
Result<SaveResult> save_single_file(Comm& comm, const StateDict& state, const std::string& root,
                                    const SaveOptions& options);

// Collective. Tensors are reconstructed region by region (rows of dim 0, at most
// SaveOptions::gather_bytes each) on the writer rank with gather_region, and written by
// the format's sequential writer while the next region is gathered (two buffers).
// `checks`: this rank's checks so far (agreed by the frame).
Result<SaveResult> save_gathered(Comm& comm, const StateDict& state, const std::string& root,
                                 const SaveOptions& options, const Status& checks);

// Collective. Rank 0 lays out one HDF5 file, then every rank writes the slices assigned
// to it into the datasets' bytes (no gather; save_hdf5.cc says why not through MPI-IO).
Result<SaveResult> save_hdf5(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                             const Status& checks);

// The frame's spec shared by both: the file name (with the format's extension), and
// the metadata the file carries instead of the plan's chunks.
FrameSpec single_file_spec(const SaveOptions& options, const Status& checks);

}  // namespace distckpt::internal_collective
