// The write strategies of single-file (and integrated native) saves, each on the save
// frame (save_frame.h). save() (save.cc) picks one; the sharded strategy is save.cc's.
#pragma once

#include <string>
#include <string_view>

#include "collective/save_frame.h"

namespace distckpt::internal_collective {

// How a save lays out its bytes: SaveSettings::integrated read with the format.
enum class SaveShape {
  kSharded,     // native: each rank writes its unique slices (save.cc)
  kOneFile,     // a single file, or native + integrated: gathered or HDF5
  kPerRankSet,  // .ckpt with integrated=false: one file per rank (save_ckpt_set.cc)
};
SaveShape save_shape(const SaveSettings& settings);
// Collective, one allreduce: kInvalidArgument on every rank unless every rank has the
// same shape, format and `integrated` (unset, false or true, since refusals depend on
// it). save() and save_async() ask before they branch: ranks that disagree must not wait
// for each other in different protocols. Also kInvalidArgument when the state's info
// value step_num or epoch_num contradicts options.step or options.epoch on any rank.
Status agree_save_shape(Comm& comm, const StateDict& state, const SaveOptions& options);
// What a save appends to the name it is given: a single file's extension; "" for a
// directory (native, per-rank sets).
std::string_view entry_extension(const SaveSettings& settings);
// The name of a per-rank set's entry: `name` without a trailing ".ckpt".
std::string per_rank_set_name(const std::string& name);

// Collective. MindSpore's non-integrated save (checkpoint.h, SaveSettings::integrated):
// every rank writes rank_<r>/<name>.ckpt with the slices the plan gives it, fsyncs it,
// and rank 0 commits the manifest (index.pb) once all agreed.
Result<SaveResult> save_ckpt_set(Comm& comm, const StateDict& state, const std::string& root,
                                 const SaveOptions& options);

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
