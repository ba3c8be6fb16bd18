#include "tier/record.h"

#include "catalog/names.h"

#include <algorithm>
#include <set>

#include "format/native/index_codec.h"
#include "storage/spare_files.h"
#include "transform/cipher.h"

namespace distckpt::internal_tier {

std::string records_dir(const std::string& root) { return internal_catalog::local_records_dir(root); }
std::string record_path(const std::string& root, const std::string& name) {
  return internal_catalog::local_record_path(root, name);
}

std::string copy_path(const std::string& local_dir, const std::string& name, const std::string& file, uint32_t kind) {
  return local_dir + "/" + name + (kind == kPartner ? "/partner/" : "/") + file;
}

std::string spare_dir(const std::string& node_dir) { return node_dir + "/" + kSpareDir; }

Status remove_node_entry(FileSystem& fs, const std::string& node_dir, const std::string& entry, bool recycle) {
  const std::string path = node_dir + "/" + entry;
  if (!recycle) return fs.remove_all(path);
  return internal_storage::retire_into_spares(fs, path, spare_dir(node_dir));
}

std::string read_node_id(FileSystem& fs, const std::string& dir) {
  auto id = read_whole_file(fs, dir + "/" + kNodeIdFile, 64);
  if (!id.ok() || id->size() != kNodeIdBytes) return "";
  return *id;
}

Result<std::string> ensure_node_id(FileSystem& fs, const std::string& dir) {
  std::string id = read_node_id(fs, dir);
  if (!id.empty()) return id;
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(dir));
  DISTCKPT_ASSIGN_OR_RETURN(std::string fresh, internal_transform::CheckpointCipher::unique_bytes(kNodeIdBytes));
  DISTCKPT_ASSIGN_OR_RETURN(std::string tmp_name, internal_transform::CheckpointCipher::unique_bytes(8));
  std::string suffix;
  for (unsigned char c : tmp_name) suffix += "0123456789abcdef"[c & 15];
  const std::string tmp = dir + "/" + kNodeIdFile + ".tmp-" + suffix;
  DISTCKPT_RETURN_IF_ERROR(write_file_synced(fs, tmp, fresh));
  Status placed = fs.rename_no_replace(tmp, dir + "/" + kNodeIdFile);
  if (!placed.ok()) (void)fs.remove_file(tmp);  // another rank of this node made it first
  if (!placed.ok() && placed.code() != StatusCode::kAlreadyExists) return placed;
  (void)fs.sync_dir(dir);
  id = read_node_id(fs, dir);
  if (id.empty()) return io_error("'" + dir + "/" + kNodeIdFile + "': cannot read back the node id");
  return id;
}

Status write_atomically(FileSystem& fs, const std::string& path, const std::string& bytes, bool fsync,
                        std::string* warning) {
  const std::string tmp = path + ".tmp";
  if (fsync) {
    DISTCKPT_RETURN_IF_ERROR(write_file_synced(fs, tmp, bytes));
  } else {
    DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tmp));
    DISTCKPT_RETURN_IF_ERROR(file->write_at(bytes.data(), bytes.size(), 0));
    DISTCKPT_RETURN_IF_ERROR(file->close());
  }
  Status renamed = fs.rename(tmp, path);
  if (!renamed.ok()) {
    (void)fs.remove_file(tmp);
    return renamed;
  }
  const std::string dir = path.substr(0, path.find_last_of('/'));
  if (!fsync) return Status();
  Status synced = fs.sync_dir(dir);
  if (synced.ok() || !warning) return synced;
  // The rename is visible: the file is in place, only its durability across a power
  // loss is in doubt. Removing it now would be worse (a reader may have seen it).
  *warning = "'" + path + "' is in place but its directory was not synced: " + synced.to_string();
  return Status();
}

Result<Redundancy> record_redundancy(const proto::Index& index) {
  return parse_redundancy(index.tier().redundancy());
}

Status validate_placement(const proto::Index& index, const std::string& path) {
  const proto::TierPlacement& p = index.tier();
  auto bad = [&](const std::string& why) { return corruption("tier record '" + path + "': " + why); };
  if (p.nodes_size() < 1 || p.nodes_size() > (1 << 20)) return bad("node count " + std::to_string(p.nodes_size()));
  std::set<int> ranks;
  std::set<std::string> ids;
  for (const auto& n : p.nodes()) {
    if (n.node_id().size() != kNodeIdBytes) return bad("a node id of " + std::to_string(n.node_id().size()) + " bytes");
    if (!ids.insert(n.node_id()).second) return bad("a node id listed twice");
    if (n.ranks_size() == 0) return bad("a node with no ranks");
    for (int r : n.ranks())
      if (r < 0 || r >= index.world_size() || !ranks.insert(r).second)
        return bad("rank " + std::to_string(r) + " out of range or on two nodes");
  }
  if (static_cast<int>(ranks.size()) != index.world_size()) return bad("not every rank is on a node");
  if (p.files_size() != index.files_size())
    return bad(std::to_string(p.files_size()) + " file placements for " + std::to_string(index.files_size()) + " files");
  for (int f = 0; f < p.files_size(); ++f) {
    const auto& tf = p.files(f);
    const uint64_t size = index.files(f).size();
    if (tf.writer_rank() < 0 || tf.writer_rank() >= index.world_size()) return bad("a file's writer rank");
    if (tf.solo_bytes() > size) return bad("file '" + index.files(f).name() + "': solo bytes beyond its size");
    if (tf.copies_size() < 1 || tf.copies_size() > p.nodes_size() * 2) return bad("file '" + index.files(f).name() + "': copy count");
    int primaries = 0;
    for (const auto& c : tf.copies()) {
      if (c.node() >= static_cast<uint32_t>(p.nodes_size()) || c.kind() > kPartner || c.bytes() > size)
        return bad("file '" + index.files(f).name() + "': a copy's node, kind or size is out of range");
      if (c.kind() == kPrimary) {
        ++primaries;
        const auto& ranks = p.nodes(static_cast<int>(c.node())).ranks();
        if (c.bytes() != size || std::find(ranks.begin(), ranks.end(), tf.writer_rank()) == ranks.end())
          return bad("file '" + index.files(f).name() + "': its own copy is not whole, or not on its writer's node");
      }
    }
    // Readers take copies(0) as the writer's own (a node's stream is its own files).
    if (primaries != 1 || tf.copies(0).kind() != kPrimary)
      return bad("file '" + index.files(f).name() + "': " + std::to_string(primaries) +
                 " own copies, or the own copy is not listed first");
  }
  // A node's stream (its files' solo bytes end to end) is what parity covers. Each is
  // bounded like a file, so that no sum of them, segment size or rebuild offset wraps.
  // One pass over the files (a file's stream is its primary copy's node, checked above).
  constexpr uint64_t kMaxStream = uint64_t{1} << 62;
  std::vector<uint64_t> streams(static_cast<std::size_t>(p.nodes_size()), 0);
  for (const auto& tf : p.files()) {
    if (tf.solo_bytes() == 0) continue;
    const uint32_t n = tf.copies(0).node();
    uint64_t& sum = streams[n];
    if (tf.solo_bytes() > kMaxStream - sum) return bad("node " + std::to_string(n) + "'s files sum to more than 2^62 bytes");
    sum += tf.solo_bytes();
  }
  auto parsed = parse_redundancy(p.redundancy());
  if (!parsed.ok()) return bad(parsed.status().message());
  const Redundancy r = *parsed;
  if (!r.parity()) {
    if (p.groups_size() != 0) return bad("parity groups without a parity redundancy");
    return Status();
  }
  if (p.data_segments() != static_cast<uint32_t>(r.k) || p.parity_segments() != static_cast<uint32_t>(r.m))
    return bad("segment counts differ from " + r.to_string());
  std::set<uint32_t> grouped;
  for (const auto& g : p.groups()) {
    if (g.nodes_size() < r.k + r.m) return bad("a parity group of " + std::to_string(g.nodes_size()) + " nodes");
    if (g.parity_crc32c_size() != g.nodes_size()) return bad("parity checksums per group node");
    // A segment is a k-th of the group's longest stream, rounded up: never more (memory
    // for a rebuild is allocated from it).
    uint64_t longest = 0;
    for (uint32_t n : g.nodes())
      if (n < streams.size()) longest = std::max(longest, streams[n]);
    if (g.segment_bytes() != (longest + static_cast<uint64_t>(r.k) - 1) / static_cast<uint64_t>(r.k))
      return bad("a parity segment of " + std::to_string(g.segment_bytes()) + " bytes for streams of at most " +
                 std::to_string(longest));
    for (uint32_t n : g.nodes())
      if (n >= static_cast<uint32_t>(p.nodes_size()) || !grouped.insert(n).second) return bad("a group's node");
  }
  if (static_cast<int>(grouped.size()) != p.nodes_size()) return bad("not every node is in a parity group");
  return Status();
}

Result<proto::Index> read_record(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, read_whole_file(fs, path, uint64_t{1} << 30));
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, internal_format::parse_index(bytes, path));
  DISTCKPT_RETURN_IF_ERROR(validate_placement(index, path));
  return index;
}

}  // namespace distckpt::internal_tier
