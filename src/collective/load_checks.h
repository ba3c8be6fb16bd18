// Checks a load makes before reading into the caller's buffers, for what its reads alone
// would not check: a single file's whole-file CRC-32, and its tensors that no rank reads
// whole.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "distckpt/comm.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"
#include "distckpt_index.pb.h"
#include "format/chunk_reader.h"

namespace distckpt::internal_collective {

// Collective: checks a whole-file CRC-32 (MindSpore's .ckpt footer) with every rank
// reading an equal share of the covered bytes; rank 0 combines the shares. Returns the
// agreed Status (kCorruption naming the file).
Status check_file_crc32(Comm& comm, internal_format::FileCache& files, const proto::Index& index,
                        const std::string& where);

// Collective. A single file's tensor is one chunk with one CRC32C (safetensors, HDF5); a
// rank that needs only a part of it reads that part alone, unchecked. Each tensor that
// some rank loads (`plan`: state tensor, index tensor) and no rank reads whole is read
// whole and checked here by one rank (largest first, each to the rank with the fewest
// bytes so far: a tensor larger than the rest is one rank's read). Returns the
// agreed Status (kCorruption naming the tensor and file).
Status check_unread_chunks(Comm& comm, internal_format::FileCache& files, const proto::Index& index,
                           const StateDict& state, const std::vector<std::pair<int, int>>& plan,
                           const std::string& where);

}  // namespace distckpt::internal_collective
