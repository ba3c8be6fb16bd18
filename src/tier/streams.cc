#include "tier/streams.h"

#include <cstring>

#include "tier/record.h"

namespace distckpt::internal_tier {

std::vector<int> stream_files(const proto::Index& record, int node) {
  std::vector<int> files;
  const proto::TierPlacement& p = record.tier();
  for (int f = 0; f < p.files_size(); ++f)
    for (const proto::TierCopy& c : p.files(f).copies())
      if (c.kind() == kPrimary && static_cast<int>(c.node()) == node && p.files(f).solo_bytes() > 0) files.push_back(f);
  return files;
}

std::vector<uint64_t> stream_lengths(const proto::Index& record) {
  std::vector<uint64_t> lengths(static_cast<std::size_t>(record.tier().nodes_size()), 0);
  for (int n = 0; n < record.tier().nodes_size(); ++n)
    for (int f : stream_files(record, n)) lengths[static_cast<std::size_t>(n)] += record.tier().files(f).solo_bytes();
  return lengths;
}

Status read_stream(FileSystem& fs, const proto::Index& record, int node, const std::string& local_dir,
                   const std::string& dir_name, uint8_t* dst, std::size_t bytes) {
  std::size_t at = 0;
  for (int f : stream_files(record, node)) {
    const uint64_t n = record.tier().files(f).solo_bytes();
    if (at + n > bytes) return internal_error("a node's stream is longer than its parity segments");
    DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(copy_path(local_dir, dir_name, record.files(f).name(), kPrimary)));
    DISTCKPT_RETURN_IF_ERROR(file->read_at(dst + at, static_cast<std::size_t>(n), 0));
    at += static_cast<std::size_t>(n);
  }
  std::memset(dst + at, 0, bytes - at);
  return Status();
}

}  // namespace distckpt::internal_tier
