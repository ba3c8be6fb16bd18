// Where the local tier keeps things, and its record (a native index with a
// TierPlacement: which node holds which copy of each data file).
//
//   <root>/.distckpt/tier/<name>    the record, committed last: the checkpoint exists
//                                   at the local tier once this file does
//   <dir>/.distckpt-node            the node's random id, made with the directory
//   <dir>/<name>/                   one node's part: its ranks' data files, partner
//                                   copies in partner/, parity in parity.bin, and the
//                                   record (the same bytes as the global one)
//   <dir>/<name>.tmp-<id>/          the same while it is written
//   <dir>/.distckpt-spare/          files of the checkpoint removed last, for the next
//                                   save to overwrite (LocalTier::recycle)
#pragma once

#include <memory>
#include <string>

#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"
#include "tier/parity.h"

namespace distckpt::internal_tier {

inline constexpr const char* kNodeIdFile = ".distckpt-node";
inline constexpr const char* kRecordFile = "record";
inline constexpr const char* kParityFile = "parity.bin";
inline constexpr const char* kSpareDir = ".distckpt-spare";  // never a checkpoint name
inline constexpr std::size_t kNodeIdBytes = 16;
inline constexpr uint32_t kPrimary = 0, kPartner = 1;

std::string records_dir(const std::string& root);
std::string record_path(const std::string& root, const std::string& name);
// A copy's path on its node.
std::string copy_path(const std::string& local_dir, const std::string& name, const std::string& file, uint32_t kind);

// The node's id in `dir`, made (with `dir`) when missing: 16 random bytes, written to a
// temporary file and renamed without replacing, so that ranks of one node racing here
// all read the same id. kIoError when the directory cannot be made or written.
Result<std::string> ensure_node_id(FileSystem& fs, const std::string& dir);
// The node's id, or "" when `dir` has none (a fresh node, or a damaged id file).
std::string read_node_id(FileSystem& fs, const std::string& dir);

// Writes `bytes` to `path` through a temporary file, fsynced and renamed (replacing),
// then fsyncs the directory. With `warning`, a failure of that last fsync (the file is
// already in place) is reported there instead of as an error.
Status write_atomically(FileSystem& fs, const std::string& path, const std::string& bytes, bool fsync,
                        std::string* warning = nullptr);

// The record at `path`: framed, parsed and validated (the index as every reader
// validates it, and the placement: every node, file and group number in range). An
// encrypted record's tensor table stays sealed (open it with open_index).
Result<proto::Index> read_record(FileSystem& fs, const std::string& path);
Status validate_placement(const proto::Index& index, const std::string& path);

// Removes one node's directory of a checkpoint (`node_dir`/`entry`, committed or
// temporary): its files become the node's spares when `recycle`, else are removed.
Status remove_node_entry(FileSystem& fs, const std::string& node_dir, const std::string& entry, bool recycle);
std::string spare_dir(const std::string& node_dir);

// The redundancy a record was saved with.
Result<Redundancy> record_redundancy(const proto::Index& index);

}  // namespace distckpt::internal_tier
