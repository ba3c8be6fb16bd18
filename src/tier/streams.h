// A node's stream, what parity protects: the solo prefixes of the data files whose
// writer ran on that node, in file order (tier/parity.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_tier {

// Per record node, its stream's length.
std::vector<uint64_t> stream_lengths(const proto::Index& record);
// The files of `node`'s stream, in order.
std::vector<int> stream_files(const proto::Index& record, int node);
// Reads node `node`'s stream from <local_dir>/<dir_name>/ into dst (`bytes` >= its
// length; the rest is zeroed).
Status read_stream(FileSystem& fs, const proto::Index& record, int node, const std::string& local_dir,
                   const std::string& dir_name, uint8_t* dst, std::size_t bytes);

}  // namespace distckpt::internal_tier
