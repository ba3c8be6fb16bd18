// The local-tier save (tier.h), on the sharded save's planner, writers, CRC32C and
// encryption. The protocol (docs/design.md, "The tier protocol"):
//   1. ranks agree on the state and the encryption; every node's leader makes sure the
//      node has its id; rank 0 plans one copy per node of each distinct chunk (chunks
//      no other node holds first in each file) and starts claiming a commit number in
//      the root, on a thread of its own that overlaps steps 2 and 3;
//   2. every rank writes and fsyncs its data file into its node's temporary directory;
//   3. redundancy: partner copies are sent to the next node, or each parity group's
//      leaders exchange segments and write parity; fsynced; all ranks agree;
//   4. rank 0 makes the record (the index with every chunk's CRC32C, the placement and
//      the commit number, sealed when encrypted); every leader writes it into its temporary directory and
//      renames that to <dir>/<name>; all agree;
//   5. rank 0 commits the record in the global root (written, fsynced, renamed); all
//      agree. Only now is the checkpoint listed. A failure before removes every node's
//      directory of it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <system_error>

#include "base/guard.h"
#include "base/kill_point.h"
#include "base/strings.h"
#include "base/test_seams.h"
#include "base/timer.h"
#include "catalog/claims.h"
#include "catalog/names.h"
#include "catalog/object_root.h"
#include "collective/save_session.h"
#include "collective/save_strategies.h"
#include "comm/agree.h"
#include "distckpt/tier.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "storage/spare_files.h"
#include "storage/write_maps.h"
#include "tier/local_save.h"
#include "tier/nodes.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "tier/redundancy.h"
#include "tier/streams.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt {

namespace internal_tier {
namespace {

using internal_base::guarded;
using internal_comm::agree;
using internal_plan::WriteItem;

// Puts each rank's chunks that no other node holds first in its file (so that one
// prefix of the file is what redundancy protects) and lays the file out again;
// returns how many chunks lead each file that way (per file id).
std::vector<std::size_t> solo_first(internal_plan::SavePlan& plan, const NodeMap& nodes) {
  // Nodes per distinct (tensor, box).
  std::map<std::pair<uint32_t, std::string>, std::set<int>> holders;
  auto key = [&](uint32_t t, uint32_t c) {
    const proto::Chunk& ch = plan.index.tensors(static_cast<int>(t)).chunks(static_cast<int>(c));
    std::string k;
    for (int64_t v : ch.offset()) k.append(reinterpret_cast<const char*>(&v), sizeof(v));
    for (int64_t v : ch.shape()) k.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return std::make_pair(t, k);
  };
  for (std::size_t r = 0; r < plan.writes.size(); ++r)
    for (const WriteItem& w : plan.writes[r]) holders[key(w.tensor, w.chunk)].insert(nodes.node_of[r]);
  std::vector<std::size_t> solo_items(static_cast<std::size_t>(plan.index.files_size()), 0);
  for (std::size_t r = 0; r < plan.writes.size(); ++r) {
    auto& items = plan.writes[r];
    if (items.empty()) continue;
    const auto solo_end = std::stable_partition(items.begin(), items.end(), [&](const WriteItem& w) {
      return holders[key(w.tensor, w.chunk)].size() == 1;
    });
    uint64_t cursor = 0;
    const uint32_t file = plan.index.tensors(static_cast<int>(items[0].tensor)).chunks(static_cast<int>(items[0].chunk)).file_id();
    for (WriteItem& w : items) {
      w.byte_offset = internal_format::chunk_start(cursor);
      cursor = w.byte_offset + w.stored_length;
      plan.index.mutable_tensors(static_cast<int>(w.tensor))->mutable_chunks(static_cast<int>(w.chunk))->set_byte_offset(w.byte_offset);
    }
    solo_items[file] = static_cast<std::size_t>(solo_end - items.begin());
    plan.index.mutable_files(static_cast<int>(file))->set_size(cursor);  // the order moved the gaps
  }
  return solo_items;
}

// Each file's solo prefix in bytes: up to the end of its last solo chunk, as the plan
// lays it out now (after apply_encryption too, which keeps the order).
std::vector<uint64_t> solo_prefix(const internal_plan::SavePlan& plan, const std::vector<std::size_t>& solo_items) {
  std::vector<uint64_t> solo(solo_items.size(), 0);
  for (const auto& items : plan.writes) {
    if (items.empty()) continue;
    const uint32_t file = plan.index.tensors(static_cast<int>(items[0].tensor)).chunks(static_cast<int>(items[0].chunk)).file_id();
    const std::size_t n = solo_items[file];
    if (n > 0) solo[file] = items[n - 1].byte_offset + items[n - 1].stored_length;
  }
  return solo;
}

// Rank 0: the placement of a plan over `nodes`.
Status place(proto::Index& index, const NodeMap& nodes, const std::vector<std::string>& ids,
             const std::vector<std::string>& hosts, const std::vector<uint64_t>& solo, const std::vector<int>& writer,
             const Redundancy& red) {
  proto::TierPlacement& p = *index.mutable_tier();
  p.set_redundancy(red.to_string());
  for (int n = 0; n < nodes.count; ++n) {
    proto::TierNode* node = p.add_nodes();
    node->set_node_id(ids[static_cast<std::size_t>(n)]);
    node->set_host(hosts[static_cast<std::size_t>(n)]);
    for (int r : nodes.ranks[static_cast<std::size_t>(n)]) node->add_ranks(r);
  }
  for (int f = 0; f < index.files_size(); ++f) {
    proto::TierFile* tf = p.add_files();
    const int w = writer[static_cast<std::size_t>(f)];
    const int n = nodes.node_of[static_cast<std::size_t>(w)];
    tf->set_writer_rank(w);
    tf->set_solo_bytes(solo[static_cast<std::size_t>(f)]);
    proto::TierCopy* own = tf->add_copies();
    own->set_node(static_cast<uint32_t>(n));
    own->set_kind(kPrimary);
    own->set_bytes(index.files(f).size());
    uint64_t copy = 0;
    if (red.kind == Redundancy::Kind::kPartner) copy = index.files(f).size();
    if (red.kind == Redundancy::Kind::kAuto) copy = solo[static_cast<std::size_t>(f)];
    if (copy > 0 && nodes.count > 1) {
      proto::TierCopy* partner = tf->add_copies();
      partner->set_node(static_cast<uint32_t>((n + 1) % nodes.count));
      partner->set_kind(kPartner);
      partner->set_bytes(copy);
    }
  }
  if (red.parity()) {
    p.set_data_segments(static_cast<uint32_t>(red.k));
    p.set_parity_segments(static_cast<uint32_t>(red.m));
    DISTCKPT_ASSIGN_OR_RETURN(auto groups, parity_groups(nodes.count, red));
    const std::vector<uint64_t> lengths = stream_lengths(index);
    for (const auto& members : groups) {
      proto::TierParityGroup* g = p.add_groups();
      uint64_t longest = 0;
      for (int n : members) {
        g->add_nodes(static_cast<uint32_t>(n));
        g->add_parity_crc32c(0);
        longest = std::max(longest, lengths[static_cast<std::size_t>(n)]);
      }
      g->set_segment_bytes((longest + static_cast<uint64_t>(red.k) - 1) / static_cast<uint64_t>(red.k));
    }
  }
  return Status();
}

// Each node's id, in one allgather that carries a leader's failure too (a status code
// byte, then the id or the message): every rank then decides alike, with no agreement.
// kInvalidArgument when two nodes share the tier's directory. Collective.
Status exchange_node_ids(Comm& comm, FileSystem& fs, const std::string& dir, const NodeMap& nodes, bool leader,
                         const std::string& where, std::vector<std::string>* node_ids, std::vector<std::string>* hosts) {
  std::string node_id;
  if (leader) {
    auto id = ensure_node_id(fs, dir);
    node_id = internal_comm::pack_outcome(id.status().with_context(where + ": local tier '" + dir + "'"),
                                          id.ok() ? *id : std::string());
  }
  const std::vector<std::string> ids = comm.allgather(leader ? node_id : std::string());
  node_ids->assign(static_cast<std::size_t>(nodes.count), std::string());
  hosts->assign(node_ids->size(), std::string());
  for (const std::string& id : ids)  // the lowest failing leader's error, as agree() gives
    DISTCKPT_RETURN_IF_ERROR(internal_comm::unpack_outcome(id));
  for (int n = 0; n < nodes.count; ++n) {
    std::string& id = (*node_ids)[static_cast<std::size_t>(n)];
    (void)internal_comm::unpack_outcome(ids[static_cast<std::size_t>(nodes.leader(n))], &id);
    if (id.empty()) return internal_error("local save: no node id from rank " + std::to_string(nodes.leader(n)));
    (*hosts)[static_cast<std::size_t>(n)] = comm.node_name(nodes.leader(n));
  }
  for (int a = 0; a < nodes.count; ++a)
    for (int b = a + 1; b < nodes.count; ++b)
      if ((*node_ids)[static_cast<std::size_t>(a)] == (*node_ids)[static_cast<std::size_t>(b)])
        return invalid_argument("local tier '" + dir + "' is the same directory on " +
                                (*hosts)[static_cast<std::size_t>(a)] + " and " + (*hosts)[static_cast<std::size_t>(b)] +
                                " (same node id): it must be node-local");
  return Status();
}

// The sums of a local save: per node, the state its ranks hold once (their data files)
// and the redundancy it stores; job totals into `out`. Collective (two allreduces).
void sum_local_save(Comm& comm, const NodeMap& nodes, const SaveResult& frame_result, uint64_t redundancy_bytes,
                    uint64_t record_bytes, LocalSaveResult* out) {
  const int my_node = nodes.node_of[static_cast<std::size_t>(comm.rank())];
  std::vector<int64_t> sums{static_cast<int64_t>(frame_result.rank_bytes_written),
                            static_cast<int64_t>(redundancy_bytes), static_cast<int64_t>(record_bytes)};
  std::vector<int64_t> per_node(static_cast<std::size_t>(2 * nodes.count), 0);
  per_node[static_cast<std::size_t>(2 * my_node)] = static_cast<int64_t>(frame_result.rank_bytes_written);
  per_node[static_cast<std::size_t>(2 * my_node + 1)] = static_cast<int64_t>(redundancy_bytes);
  comm.allreduce(sums, ReduceOp::kSum);
  comm.allreduce(per_node, ReduceOp::kSum);
  for (int n = 0; n < nodes.count; ++n) {
    const auto state_bytes = static_cast<uint64_t>(per_node[static_cast<std::size_t>(2 * n)]);
    const auto stored = state_bytes + static_cast<uint64_t>(per_node[static_cast<std::size_t>(2 * n + 1)]);
    out->node_state_max = std::max(out->node_state_max, state_bytes);
    out->node_bytes_max = std::max(out->node_bytes_max, stored);
    if (state_bytes > 0)
      out->storage_ratio = std::max(out->storage_ratio, static_cast<double>(stored) / static_cast<double>(state_bytes));
  }
  out->save = frame_result;
  out->save.bytes_written = static_cast<uint64_t>(sums[0]);
  out->save.index_bytes = static_cast<uint64_t>(sums[2]);
  out->redundancy_bytes = static_cast<uint64_t>(sums[1]);
}

void remove_quietly(FileSystem& fs, const std::string& path) {
  if (fs.exists(path)) (void)fs.remove_all(path);
}

}  // namespace
}  // namespace internal_tier

namespace internal_tier {

namespace {

// Step 3: the redundancy (partner copies, or parity), agreed. Returns the bytes written
// and, with parity, this node's parity CRC.
Status write_redundancy(Comm& comm, internal_collective::SaveFrame& frame, LocalPart& part, uint64_t* bytes,
                        uint32_t* parity_crc) {
  const std::string where = "local save: rank " + std::to_string(comm.rank());
  internal_base::Timer redundancy_timer;
  Status local = internal_base::guarded(where + ": redundancy", [&]() -> Status {
    if (part.red.parity()) {
      DISTCKPT_ASSIGN_OR_RETURN(*parity_crc, write_parity(comm, *frame.fs, part.placed, part.nodes, part.tier.dir,
                                                          part.tmp_name, part.red, frame.options.fsync, bytes));
      return Status();
    }
    return send_partner_copies(comm, *frame.fs, part.placed, part.nodes, part.tmp_dir, frame.options.fsync, bytes);
  });
  internal_base::kill_point("local-redundancy");
  part.out.redundancy_s = redundancy_timer.seconds();
  frame.result.write_s += part.out.redundancy_s;
  return internal_comm::agree(comm, local);
}

// Step 4, rank 0: the record (the index with every chunk's CRC32C and tag, the parity
// CRCs and the commit number, sealed when encrypted), framed.
Result<std::string> make_record(internal_collective::SaveFrame& frame, LocalPart& part,
                                const std::vector<std::string>& all_crcs, const std::vector<std::string>& all_tags,
                                const std::vector<std::string>& parity_crcs) {
  DISTCKPT_RETURN_IF_ERROR(internal_collective::fill_checksums(frame, all_crcs, all_tags));
  proto::Index index = frame.plan.index;
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t seq, part.commit_seq.get());
  index.set_commit_seq(seq);
  for (proto::TierParityGroup& g : *index.mutable_tier()->mutable_groups())
    for (int i = 0; i < g.nodes_size(); ++i) {
      uint32_t crc;
      std::memcpy(&crc, parity_crcs[static_cast<std::size_t>(part.nodes.leader(static_cast<int>(g.nodes(i))))].data(),
                  sizeof(crc));
      g.set_parity_crc32c(i, crc);
    }
  index.set_created_unix_ms(internal_base::wall_clock_ms());
  if (frame.cipher) DISTCKPT_RETURN_IF_ERROR(internal_format::seal_index(&index, *frame.cipher, frame.salt));
  return internal_format::frame_index(index);
}

// Collective, the seam's commit: steps 3-5 and the sums. After a failure every node's
// directory of this save is gone and no record is committed.
Status commit_local(Comm& comm, internal_collective::SaveFrame& frame, LocalPart& part) {
  FileSystem& fs = *frame.fs;
  const int me = comm.rank();
  const std::string where = "local save: rank " + std::to_string(me);
  auto cleanup = [&] {
    if (part.leader) remove_quietly(fs, part.tmp_dir);
  };
  uint64_t redundancy_bytes = 0;
  uint32_t parity_crc = 0;
  if (Status st = write_redundancy(comm, frame, part, &redundancy_bytes, &parity_crc); !st.ok()) {
    cleanup();
    return st;
  }

  // Step 4.
  internal_base::Timer commit_timer;
  std::string mine_tags;
  for (const std::string& tag : *part.tags) mine_tags += tag;
  const std::vector<uint32_t>& crcs = **part.crcs;
  std::string mine_crcs(reinterpret_cast<const char*>(crcs.data()), crcs.size() * sizeof(uint32_t));
  const std::vector<std::string> all_crcs = comm.gather(mine_crcs, 0);
  const std::vector<std::string> all_tags = comm.gather(mine_tags, 0);
  const std::vector<std::string> parity_crcs =
      comm.gather(std::string(reinterpret_cast<const char*>(&parity_crc), sizeof(parity_crc)), 0);
  std::string record;
  Status local;
  if (me == 0) {
    local = internal_base::guarded("local save: rank 0: record", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(record, make_record(frame, part, all_crcs, all_tags, parity_crcs));
      return Status();
    });
  }
  if (Status st = internal_comm::agree(comm, local); !st.ok()) {
    cleanup();
    return st;
  }
  comm.broadcast_string(record, 0);
  if (part.leader) {
    local = internal_base::guarded(where + ": commit on this node", [&]() -> Status {
      DISTCKPT_RETURN_IF_ERROR(write_atomically(fs, part.tmp_dir + "/" + kRecordFile, record, frame.options.fsync));
      if (frame.options.fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(part.tmp_dir + "/partner"));
      remove_quietly(fs, part.final_dir);  // a leftover of a save that never committed its record
      DISTCKPT_RETURN_IF_ERROR(fs.rename(part.tmp_dir, part.final_dir));
      if (frame.options.fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(part.tier.dir));
      return Status();
    });
  }
  internal_base::kill_point("local-node-commit");
  if (Status st = internal_comm::agree(comm, local); !st.ok()) {
    cleanup();
    if (part.leader) remove_quietly(fs, part.final_dir);
    return st;
  }

  // Step 5.
  std::string record_warning;
  if (me == 0)
    local = internal_base::guarded("local save: rank 0: commit the record", [&] {
      return write_atomically(fs, record_path(part.root, frame.name), record, frame.options.fsync, &record_warning);
    });
  if (Status st = internal_comm::agree(comm, local); !st.ok()) {
    if (part.leader) remove_quietly(fs, part.final_dir);
    return st;
  }
  comm.broadcast_string(record_warning, 0);
  if (!record_warning.empty())
    frame.result.warning += (frame.result.warning.empty() ? "" : "; ") + ("local save: " + record_warning);
  frame.result.commit_s = commit_timer.seconds();
  sum_local_save(comm, part.nodes, frame.result, redundancy_bytes, record.size(), &part.out);
  frame.result = part.out.save;
  return Status();
}

}  // namespace

namespace {

// Step 1 on the frame: this rank's checks of the tier's options, the redundancy parsed.
Status check_local_options(const SaveOptions& options, const LocalTier& tier, int nodes, Redundancy* red) {
  if (tier.dir.empty()) return invalid_argument("empty local tier directory");
  if (internal_collective::save_shape(options) != internal_collective::SaveShape::kSharded)
    return invalid_argument("the local tier keeps native sharded checkpoints only");
  if (options.incremental)
    return invalid_argument("the local tier writes every chunk (incremental saves reference files in the global root "
                            "only; a node's files must not depend on another checkpoint's)");
  DISTCKPT_ASSIGN_OR_RETURN(*red, parse_redundancy(tier.redundancy));
  if (red->kind != Redundancy::Kind::kAuto && red->kind != Redundancy::Kind::kNone)
    DISTCKPT_RETURN_IF_ERROR(parity_groups(nodes, *red).status());
  return Status();
}

// Rank 0, the frame's shape_index: chunks no other node holds first in each file, the
// chunks' encryption, and the placement over the nodes.
Status place_plan(internal_collective::SaveFrame& frame, const LocalPart& part) {
  const std::vector<std::size_t> solo_items = solo_first(frame.plan, part.nodes);
  if (frame.cipher) internal_plan::apply_encryption(*frame.cipher, &frame.plan);
  const std::vector<uint64_t> solo = solo_prefix(frame.plan, solo_items);
  proto::Index& index = frame.plan.index;
  std::vector<int> writer(static_cast<std::size_t>(index.files_size()), 0);
  for (std::size_t r = 0; r < frame.plan.writes.size(); ++r)
    if (!frame.plan.writes[r].empty())
      writer[index.tensors(static_cast<int>(frame.plan.writes[r][0].tensor))
                 .chunks(static_cast<int>(frame.plan.writes[r][0].chunk))
                 .file_id()] = static_cast<int>(r);
  return place(index, part.nodes, part.node_ids, part.hosts, solo, writer, part.red);
}

// Rank 0, the seam's name: the checkpoint's name is free in the root, the records'
// directory exists, and the claim of a commit number starts on a thread of its own. The
// temporary name is the catalog's scheme for names in flight ("<name>.tmp-<16 hex>"), so
// listings and gc tell an abandoned local save as they tell a global one.
Result<std::string> name_local(internal_collective::SaveFrame& frame, LocalPart& part) {
  FileSystem& fs = *frame.fs;
  const std::string& root = part.root;
  const std::string& name = frame.name;
  if (fs.exists(root + "/" + name) || fs.exists(record_path(root, name)))
    return already_exists("checkpoint '" + name + "' already exists in '" + root + "'");
  DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(records_dir(root)));
  std::shared_ptr<FileSystem> fs_handle = frame.fs;
  auto claim = [fs_handle, root] { return internal_catalog::claim_commit_seq(*fs_handle, root); };
  try {
    part.commit_seq = std::async(std::launch::async, claim);
  } catch (const std::system_error&) {  // no thread to be had: claim it now
    std::promise<Result<uint64_t>> now;
    try {
      now.set_value(claim());
    } catch (...) {  // rethrown by get(), inside step 4's guarded block
      now.set_exception(std::current_exception());
    }
    part.commit_seq = now.get_future();
  }
  return internal_base::base_name(internal_catalog::make_tmp_name(part.tier.dir, name));
}

// Collective, the seam's open: every node's temporary directory, made by its leader.
Status open_local(Comm& comm, internal_collective::SaveFrame& frame, LocalPart& part, const std::string& tmp_name,
                  bool recycle) {
  FileSystem& fs = *frame.fs;
  part.placed = frame.plan.index;
  part.tmp_name = tmp_name;
  part.tmp_dir = part.tier.dir + "/" + tmp_name;
  part.final_dir = part.tier.dir + "/" + frame.name;
  Status local = frame.my_writes_error;
  if (local.ok() && tmp_name.empty()) local = internal_error("local save: no temporary name from rank 0");
  if (part.leader && local.ok()) {
    local = fs.create_dir(part.tmp_dir);
    if (local.ok()) local = fs.create_dir(part.tmp_dir + "/partner");
    local = local.with_context("local save: rank " + std::to_string(comm.rank()));
  }
  frame.entry.tmp = part.tmp_dir;
  frame.entry.root = part.tier.dir;
  frame.entry.name = frame.name;
  frame.entry.directory = true;
  if (recycle) frame.spare_dir = spare_dir(part.tier.dir);
  Status agreed = internal_comm::agree(comm, local);
  if (!agreed.ok() && part.leader) remove_quietly(fs, part.tmp_dir);
  return agreed;
}

// Collective, right after the write agreement: the data files took their spares; what
// is left (the previous partner copies, parity and record) goes now, before this save
// writes its own redundancy: the node never holds more than it would without spares.
void drop_local_spares(Comm& comm, internal_collective::SaveFrame& frame, const LocalPart& part) {
  if (frame.spare_dir.empty()) return;
  if (part.leader) internal_storage::drop_spares(*frame.fs, frame.spare_dir);
  // Before the redundancy is written: every process's mappings of the spares just
  // dropped give their pages back (write_maps.h).
  comm.barrier();
  internal_storage::prune_write_mappings();
}

}  // namespace

Result<LocalSession> begin_local(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                                 const LocalTier& tier_in) {
  LocalSession ls;
  ls.part = std::make_shared<LocalPart>();
  LocalPart& part = *ls.part;
  part.tier = LocalTier{node_dir(comm, tier_in.dir, comm.rank()), tier_in.redundancy};
  part.root = root;
  part.nodes = node_map(comm);
  part.leader = part.nodes.leader(part.nodes.node_of[static_cast<std::size_t>(comm.rank())]) == comm.rank();
  const std::string where = "local save: rank " + std::to_string(comm.rank());

  internal_collective::FrameSpec spec;
  spec.name = options.name;
  spec.extra_checks = internal_base::guarded(
      where, [&] {
        // The tier's records and drains live in a file-system root (one file system serves
        // the nodes' directories and the root).
        if (internal_catalog::is_object_root(root))
          return unsupported("the node-local tier needs a file-system root; '" + root + "' is an object root");
        return check_local_options(options, part.tier, part.nodes.count, &part.red);
      });
  spec.node_of = &part.nodes.node_of;
  // Ranks that chose another redundancy or recycling would part ways at its collectives.
  spec.same_words = {static_cast<int64_t>(part.red.kind), part.red.k, part.red.m, tier_in.recycle ? 1 : 0};
  spec.same_what = "the local tier's redundancy and recycle";
  spec.before_plan = [&part, where](Comm& c, internal_collective::SaveFrame& frame) {
    // After a collective, so after every leader's cleanup of a save that failed: the
    // mappings of its removed files give their pages back before this save needs them.
    internal_storage::prune_write_mappings();
    return exchange_node_ids(c, *frame.fs, part.tier.dir, part.nodes, part.leader, where, &part.node_ids,
                             &part.hosts);
  };
  spec.shape_index = [&part](internal_collective::SaveFrame& frame) { return place_plan(frame, part); };
  spec.share_index = true;  // every rank sends or receives redundancy from the placement
  auto seam = std::make_shared<internal_collective::EntrySeam>();
  std::shared_ptr<LocalPart> shared = ls.part;  // the seam outlives this call (close_save)
  const bool recycle = tier_in.recycle;
  seam->name = [shared](internal_collective::SaveFrame& frame) { return name_local(frame, *shared); };
  seam->open = [shared, recycle](Comm& c, internal_collective::SaveFrame& frame, const std::string& tmp_name) {
    return open_local(c, frame, *shared, tmp_name, recycle);
  };
  seam->after_write = [shared](Comm& c, internal_collective::SaveFrame& frame) { drop_local_spares(c, frame, *shared); };
  seam->commit = [shared](Comm& c, internal_collective::SaveFrame& frame) { return commit_local(c, frame, *shared); };
  seam->discard = [shared](const internal_collective::SaveFrame& frame) {
    if (shared->leader) remove_quietly(*frame.fs, shared->tmp_dir);
  };
  spec.seam = seam;
  SaveOptions local_options = options;
  local_options.checksum = true;  // local files are always verified before use
  DISTCKPT_ASSIGN_OR_RETURN(ls.session, internal_collective::begin_planned_save(comm, state, root, local_options, spec));
  return ls;
}

Result<LocalSaveResult> finish_local(Comm& comm, LocalSession& ls, const Result<std::vector<uint32_t>>& crcs) {
  LocalPart& part = *ls.part;
  part.crcs = &crcs;
  part.tags = &ls.session.tags;
  part.out = LocalSaveResult();
  internal_base::kill_point("local-write");
  // Step 2's agreement, then steps 3-5 (commit_local), on the save frame.
  auto saved = internal_collective::close_save(comm, ls.session.frame, crcs.status(), nullptr);
  part.crcs = nullptr;
  part.tags = nullptr;
  if (!saved.ok()) return saved.status();
  LocalSaveResult out = part.out;
  out.save = *saved;
  out.save.path = record_path(part.root, ls.session.frame.name);
  return out;
}

}  // namespace internal_tier

Result<LocalSaveResult> save_local(Comm& comm, const StateDict& state, const std::string& root,
                                   const SaveOptions& options, const LocalTier& tier) {
  DISTCKPT_ASSIGN_OR_RETURN(internal_tier::LocalSession ls, internal_tier::begin_local(comm, state, root, options, tier));
  // Step 2.
  internal_base::Timer write_timer;
  auto crcs = internal_collective::write_session(ls.session, state, comm, &ls.session.frame.result.rank_bytes_written);
  ls.session.frame.result.write_s = write_timer.seconds();
  return internal_tier::finish_local(comm, ls, crcs);
}

}  // namespace distckpt
