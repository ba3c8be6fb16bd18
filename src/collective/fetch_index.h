// The first step of every collective read (load, load_all): rank 0 resolves the path
// and reads the checkpoint's description (a native index, or a single file described
// as one), every rank gets the same bytes and parses and validates them alike.
#pragma once

#include <memory>
#include <string>

#include "distckpt/comm.h"
#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_collective {

struct FetchedIndex {
  std::string path;  // the checkpoint resolved (a root gives its newest)
  proto::Index index;
};

// Collective. Errors (resolution, reading, parsing) are agreed: identical on every rank,
// with `where` as context.
Result<FetchedIndex> fetch_index(Comm& comm, const std::shared_ptr<FileSystem>& fs, const std::string& path,
                                 const std::string& where);

}  // namespace distckpt::internal_collective
