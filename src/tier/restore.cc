// Restore from the fastest tier (tier.h). Every rank plans the whole job's reads from
// the same inputs (the record, the global index, which copies each node has), so the
// plan is the same everywhere without exchanging it:
//
//   1. rank 0 picks the checkpoint and reads its record (and the global index, when it
//      was drained); every node's leader reads its node id and checks which copies of
//      the record's files it holds; all ranks learn all of it;
//   2. every distinct chunk a rank needs (its boxes, any layout, any world size) gets a
//      provider: its own node when that node holds a copy, else a surviving node that
//      does (the least loaded); one rank of the provider node reads the chunk once,
//      whole, checks it (CRC32C, and AEAD when encrypted), and sends each needer its
//      region;
//   3. copies that failed their check are marked lost on every rank and their pieces
//      are planned again (step 2) from the other copies;
//   4. pieces no surviving copy holds: the parity groups rebuild the lost nodes' files
//      onto a surviving node (tier/parity.h), and step 2 runs again;
//   5. what is still missing is read from the global root (each chunk once in the
//      job); with no global copy the checkpoint is not restorable and the next older
//      one is tried.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "base/guard.h"
#include "base/timer.h"
#include "catalog/listing.h"
#include "catalog/names.h"
#include "plan/load_names.h"
#include "plan/load_staging.h"
#include "layout/strided.h"
#include "collective/save_frame.h"
#include "comm/agree.h"
#include "distckpt/inspect.h"
#include "distckpt/tier.h"
#include "format/chunk_reader.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "layout/region.h"
#include "plan/load_plan.h"
#include "tier/nodes.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "tier/streams.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"
#include "transform/float_cast.h"
#include "tier/restore_plan.h"

namespace distckpt {

namespace internal_tier {
namespace {

using internal_base::guarded;
using internal_comm::agree;

// Opens an index read on rank 0 (bytes) with the key; checks the state against it.
Status open_and_check(proto::Index* index, const std::string& bytes, const std::string& path, const LoadOptions& options,
                      std::shared_ptr<const internal_transform::CheckpointCipher>* cipher, bool record) {
  DISTCKPT_ASSIGN_OR_RETURN(*index, internal_format::parse_index(bytes, path));
  if (record) DISTCKPT_RETURN_IF_ERROR(validate_placement(*index, path));
  DISTCKPT_ASSIGN_OR_RETURN(*cipher, internal_format::open_index(index, options.key.get(), path));
  std::string warning;
  return internal_format::check_unchecked(*index, path, options.allow_unchecked, &warning);
}

// Whether the global checkpoint of a record's name is its drained copy: the same step
// and epoch, and every tensor of the record there with the same dtype and shape. Names
// are reused (a checkpoint removed and saved again, or another series' save); a
// different checkpoint's bytes must never fill in for lost local ones.
bool is_drained_copy(const proto::Index& record, const proto::Index& global) {
  if (record.step() != global.step() || record.epoch() != global.epoch()) return false;
  std::map<std::string, const proto::Tensor*> by_name;
  for (const proto::Tensor& t : global.tensors()) by_name[t.name()] = &t;
  for (const proto::Tensor& t : record.tensors()) {
    auto it = by_name.find(t.name());
    if (it == by_name.end() || it->second->dtype() != t.dtype() ||
        !std::equal(t.global_shape().begin(), t.global_shape().end(), it->second->global_shape().begin(),
                    it->second->global_shape().end()))
      return false;
  }
  return true;
}

// One attempt at `name`. kNotFound when the bytes are lost beyond every tier.
Result<RestoreResult> restore_one(Comm& comm, StateDict& state, const std::string& root, const LocalTier& tier,
                                  const RestoreOptions& options, const std::string& name, bool use_local) {
  internal_base::Timer timer;
  FileSystem& fs = options.load.fs ? *options.load.fs : *posix_filesystem();
  const int me = comm.rank();
  const std::string where = "restore: rank " + std::to_string(me);
  const NodeMap nodes = node_map(comm);
  const int my_node = nodes.node_of[static_cast<std::size_t>(me)];
  const bool leader = nodes.leader(my_node) == me;
  Attempt a;
  a.name = name;
  RestoreResult result;
  result.name = name;

  // Step 1.
  std::string record_bytes, global_bytes;
  Status local;
  if (me == 0) {
    local = guarded(where, [&]() -> Status {
      if (use_local && fs.exists(record_path(root, name))) {
        DISTCKPT_ASSIGN_OR_RETURN(record_bytes, read_whole_file(fs, record_path(root, name), uint64_t{1} << 30));
      }
      if (fs.exists(root + "/" + name + "/" + internal_format::kIndexFileName)) {
        DISTCKPT_ASSIGN_OR_RETURN(global_bytes, internal_format::read_index_bytes(fs, root + "/" + name));
      }
      if (record_bytes.empty() && global_bytes.empty())
        return not_found("checkpoint '" + name + "' is in no tier of '" + root + "'");
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(record_bytes, 0);
  comm.broadcast_string(global_bytes, 0);
  a.has_record = !record_bytes.empty();
  a.has_global = !global_bytes.empty();
  local = guarded(where, [&]() -> Status {
    if (a.has_record)
      DISTCKPT_RETURN_IF_ERROR(open_and_check(&a.record, record_bytes, record_path(root, name), options.load,
                                              &a.record_cipher, true));
    if (a.has_global)
      DISTCKPT_RETURN_IF_ERROR(open_and_check(&a.global, global_bytes, root + "/" + name, options.load,
                                              &a.global_cipher, false));
    if (state.rank() != me) return invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  // The same indexes on every rank: the same decision.
  if (a.has_record && a.has_global && !is_drained_copy(a.record, a.global)) {
    if (me == 0)
      std::fprintf(stderr,
                   "distckpt: restore: '%s/%s' is another checkpoint than the local tier's record of that name "
                   "(step, epoch or tensors differ): not used for it\n",
                   root.c_str(), name.c_str());
    a.has_global = false;
    a.global = proto::Index();
  }
  DISTCKPT_RETURN_IF_ERROR(internal_collective::agree_on_state(comm, state));
  const proto::Index& described = a.has_record ? a.record : a.global;

  // Node ids, and which copies each node holds.
  std::string id;
  if (leader && use_local) id = read_node_id(fs, tier.dir);
  const std::vector<std::string> ids = comm.allgather(leader ? id : std::string());
  if (a.has_record) {
    a.current_of.assign(static_cast<std::size_t>(a.record.tier().nodes_size()), -1);
    for (int rn = 0; rn < a.record.tier().nodes_size(); ++rn)
      for (int n = 0; n < nodes.count; ++n)
        if (!ids[static_cast<std::size_t>(nodes.leader(n))].empty() &&
            ids[static_cast<std::size_t>(nodes.leader(n))] == a.record.tier().nodes(rn).node_id())
          a.current_of[static_cast<std::size_t>(rn)] = n;
  }
  std::vector<std::vector<char>> present;
  if (a.has_record) {
    std::vector<int64_t> flags;
    for (int f = 0; f < a.record.tier().files_size(); ++f)
      for (const proto::TierCopy& c : a.record.tier().files(f).copies()) {
        int64_t here = 0;
        if (leader && a.current_of[c.node()] == my_node) {
          auto size = fs.file_size(copy_path(tier.dir, name, a.record.files(f).name(), c.kind()));
          here = size.ok() && *size >= c.bytes() ? 1 : 0;
        }
        flags.push_back(here);
      }
    comm.allreduce(flags, ReduceOp::kMax);
    std::size_t at = 0;
    for (int f = 0; f < a.record.tier().files_size(); ++f) {
      present.emplace_back();
      for (int k = 0; k < a.record.tier().files(f).copies_size(); ++k) present.back().push_back(flags[at++] ? 1 : 0);
    }
  }

  // The pieces: every rank's boxes (from the agreed layouts) against the distinct chunks.
  std::map<std::pair<std::string, Box>, int> by_box;
  internal_plan::LoadNames names;
  // State tensor -> the dtype it is staged in: its stored one (LoadOptions::cast_floats),
  // or its own for strided buffers.
  std::map<int, DType> casts;
  local = guarded(where, [&]() -> Status {
    // The load's filters and renames, as a global load applies them.
    DISTCKPT_ASSIGN_OR_RETURN(names, internal_plan::load_names(described, options.load));
    result.load.filtered_out = names.filtered_out;
    const std::map<std::string, int>& stored = names.by_state_name;
    std::set<std::string> asked;
    for (std::size_t i = 0; i < state.tensors().size(); ++i) {
      const TensorEntry& e = state.tensors()[i];
      asked.insert(e.name);
      auto it = stored.find(e.name);
      if (it == stored.end()) {
        if (options.load.strict)
          return mismatch("tensor '" + e.name + "' is not in checkpoint '" + name + "'" +
                          (names.selective ? " (as the load's filters and renames see it)" : ""));
        result.load.missing_in_checkpoint.push_back(e.name);
        continue;
      }
      const proto::Tensor& t = described.tensors(it->second);
      DType read_dtype = e.dtype;
      if (t.dtype() != dtype_name(e.dtype)) {
        const std::optional<DType> stored_dtype = dtype_from_name(t.dtype());  // validated with the index
        const bool castable = stored_dtype && internal_transform::is_floating(*stored_dtype) &&
                              internal_transform::is_floating(e.dtype);
        if (!options.load.cast_floats || !castable)
          return mismatch("tensor '" + e.name + "': dtype " + std::string(dtype_name(e.dtype)) + " in the state dict, " +
                          t.dtype() + " in the checkpoint" +
                          (castable ? " (LoadOptions::cast_floats converts between floating dtypes)" : ""));
        read_dtype = *stored_dtype;
        casts[static_cast<int>(i)] = read_dtype;
      }
      DISTCKPT_RETURN_IF_ERROR(internal_layout::check_writable(e));
      if (e.strided()) casts.emplace(static_cast<int>(i), e.dtype);
      if (!std::equal(t.global_shape().begin(), t.global_shape().end(), e.layout.global_shape().begin(),
                      e.layout.global_shape().end()))
        return mismatch("tensor '" + e.name + "': global shape " + full_box(e.layout.global_shape()).to_string() +
                        " in the state dict, another in the checkpoint");
      // Distinct boxes of the stored tensor.
      proto::Tensor dedup;
      *dedup.mutable_global_shape() = t.global_shape();
      std::vector<int> dedup_id;
      for (const proto::Chunk& ch : t.chunks()) {
        const Box b = internal_format::chunk_box(ch);
        // Keyed by the stored name: add_copies looks chunks up in the record and the
        // global index, which know no renames.
        auto [pos, fresh] = by_box.emplace(std::make_pair(t.name(), b), static_cast<int>(a.distinct.size()));
        if (fresh) {
          Distinct d;
          d.record_tensor = it->second;
          d.box = b;
          d.plain_bytes = static_cast<uint64_t>(b.num_elements()) * dtype_size(read_dtype);
          a.distinct.push_back(d);
          *dedup.add_chunks() = ch;
          dedup_id.push_back(pos->second);
        }
      }
      const internal_plan::ChunkLookup lookup(dedup);
      for (int r = 0; r < comm.size(); ++r) {
        const std::vector<Box> boxes = e.layout.boxes_of(r);
        for (std::size_t b = 0; b < boxes.size(); ++b) {
          if (boxes[b].num_elements() == 0) continue;
          int64_t covered = 0;
          for (const auto& read : lookup.plan_reads(boxes[b], &covered)) {
            Piece p;
            p.state_tensor = static_cast<int>(i);
            p.rank = r;
            p.box = static_cast<int>(b);
            p.distinct = dedup_id[static_cast<std::size_t>(read.chunk)];
            p.region = read.region;
            p.bytes = static_cast<uint64_t>(read.region.num_elements()) * dtype_size(read_dtype);
            a.pieces.push_back(p);
          }
          if (covered != boxes[b].num_elements())
            return corruption("tensor '" + e.name + "': checkpoint '" + name + "' does not cover box " +
                              boxes[b].to_string());
        }
      }
      if (static_cast<int>(i) >= 0) result.load.loaded.push_back(e.name);
    }
    for (const auto& [state_name, t] : stored)
      if (!asked.count(state_name)) result.load.unexpected_in_checkpoint.push_back(described.tensors(t).name());
    return internal_plan::refuse_unexpected(names, state, options.load, name);
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  // Tensors to cast, or with strided buffers, are restored, from every source alike,
  // into a packed staging buffer per box (the same state dict with those buffers), and
  // converted and scattered once every byte arrived (plan/load_staging.h).
  StateDict staged_state(state.rank());
  std::map<int, std::vector<std::vector<char>>> staged;
  local = guarded(where, [&]() -> Status {
    if (casts.empty()) return Status();
    for (std::size_t i = 0; i < state.tensors().size(); ++i) {
      const TensorEntry& e = state.tensors()[i];
      auto it = casts.find(static_cast<int>(i));
      if (it == casts.end()) {
        DISTCKPT_RETURN_IF_ERROR(staged_state.add_view(e));
        continue;
      }
      std::vector<void*> buffers;
      for (const Box& box : e.boxes) {
        staged[it->first].emplace_back(static_cast<std::size_t>(box.num_elements()) * dtype_size(it->second));
        buffers.push_back(staged[it->first].back().data());
      }
      DISTCKPT_RETURN_IF_ERROR(staged_state.add_tensor(e.name, it->second, std::move(buffers), e.layout));
    }
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  StateDict& target = casts.empty() ? state : staged_state;
  if (a.has_record) add_copies(a, a.record, false, by_box, present);

  // Steps 2-5.
  std::vector<int> pending(a.pieces.size());
  for (std::size_t i = 0; i < pending.size(); ++i) pending[i] = static_cast<int>(i);
  Counters counters;
  Status fatal;
  bool rebuilt = false, global_added = false;
  internal_base::Timer read_timer;
  while (!pending.empty()) {
    const std::size_t before = pending.size();
    pending = run_round(comm, target, a, tier, root, fs, pending, nodes, &counters, &fatal);
    if (!fatal.ok()) return fatal;
    if (pending.empty()) break;
    if (pending.size() < before) continue;  // progress: plan what is left again
    if (!rebuilt && a.has_record && a.record.tier().groups_size() > 0) {
      rebuilt = true;
      // Record nodes whose copies were all lost or failed count as lost.
      std::set<int> lost;
      for (int rn = 0; rn < a.record.tier().nodes_size(); ++rn) {
        if (a.current_of[static_cast<std::size_t>(rn)] < 0) {
          lost.insert(rn);
          continue;
        }
        for (int f : stream_files(a.record, rn))
          for (const Copy& c : a.copies)
            if (!c.global && c.file == f && c.kind == kPrimary && !c.usable) lost.insert(rn);
        for (int f : stream_files(a.record, rn))
          if (!present[static_cast<std::size_t>(f)][0]) lost.insert(rn);
      }
      auto red = record_redundancy(a.record);
      internal_base::Timer rebuild_timer;
      // Agreed on every rank. Whatever failed (a damaged parity, a full disk for the
      // rebuilt files, memory), the global copy may still have the bytes: go on to it.
      Status st = red.ok() ? rebuild(comm, fs, a, tier, nodes, *red, lost, &counters) : red.status();
      result.rebuild_s = rebuild_timer.seconds();
      if (!st.ok() && me == 0) std::fprintf(stderr, "distckpt: restore '%s': parity rebuild: %s\n", name.c_str(), st.to_string().c_str());
      continue;
    }
    if (!global_added && a.has_global) {
      global_added = true;
      add_copies(a, a.global, true, by_box, present);
      continue;
    }
    return not_found("checkpoint '" + name + "': " + std::to_string(pending.size()) +
                     " pieces of state are lost beyond its redundancy (" +
                     (a.has_record ? a.record.tier().redundancy() : std::string("no local tier")) + ") and " +
                     (a.has_global ? "the global copy failed" : "it was not drained to the global root"));
  }
  result.load.read_s = read_timer.seconds();
  for (const auto& [i, from] : casts) {
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(i)];
    for (std::size_t b = 0; b < e.boxes.size(); ++b) internal_plan::write_back(e, b, staged.at(i)[b].data(), from);
  }

  std::vector<int64_t> totals{static_cast<int64_t>(counters.sources.local), static_cast<int64_t>(counters.sources.peer),
                              static_cast<int64_t>(counters.sources.parity), static_cast<int64_t>(counters.sources.global),
                              static_cast<int64_t>(counters.sources.parity_read),
                              static_cast<int64_t>(counters.sources.storage_read), static_cast<int64_t>(counters.needed)};
  comm.allreduce(totals, ReduceOp::kSum);
  result.sources.local = static_cast<uint64_t>(totals[0]);
  result.sources.peer = static_cast<uint64_t>(totals[1]);
  result.sources.parity = static_cast<uint64_t>(totals[2]);
  result.sources.global = static_cast<uint64_t>(totals[3]);
  result.sources.parity_read = static_cast<uint64_t>(totals[4]);
  result.sources.storage_read = static_cast<uint64_t>(totals[5]);
  for (const Copy& c : a.copies)
    if (!c.usable) ++result.sources.lost_chunks;
  result.load.bytes_read = result.sources.storage_read;
  result.load.bytes_needed = static_cast<uint64_t>(totals[6]);
  result.load.step = described.step();
  result.load.epoch = described.epoch();
  result.load.info = internal_format::info_values(described);
  result.load.load_s = timer.seconds();
  return result;
}

struct Candidate {
  std::string name;
  uint64_t seq = 0;
  bool advances_latest = false;  // saved to move `latest`: a default resume point
};

// Rank 0: checkpoints of any tier, newest first, each saying whether it moved `latest`.
Result<std::vector<Candidate>> candidates(FileSystem& fs, const std::string& root, std::shared_ptr<FileSystem> handle,
                                          bool use_local) {
  std::vector<Candidate> out;
  std::set<std::string> seen;
  if (use_local) {
    DISTCKPT_ASSIGN_OR_RETURN(auto records, list_local_records(root, handle));
    for (const auto& r : records)
      if (seen.insert(r.name).second) out.push_back({r.name, r.commit_seq, r.advances_latest});
  }
  InspectOptions io;
  io.fs = handle;
  auto listing = list_checkpoints(root, io);
  if (listing.ok()) {
    for (const auto& e : listing->entries)
      if (e.state == EntryState::kCommitted && e.format == Format::kNative && seen.insert(e.name).second)
        out.push_back({e.name, e.commit_seq, e.advances_latest});
  } else if (listing.status().code() != StatusCode::kNotFound) {
    return listing.status();
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.seq > b.seq; });
  (void)fs;
  return out;
}

}  // namespace
}  // namespace internal_tier

Result<std::vector<TierRecordInfo>> list_local_records(const std::string& root, std::shared_ptr<FileSystem> fs) {
  using namespace internal_tier;
  if (!fs) fs = posix_filesystem();
  std::vector<TierRecordInfo> out;
  const std::string dir = records_dir(root);
  if (!fs->exists(dir)) return out;
  DISTCKPT_ASSIGN_OR_RETURN(auto entries, fs->list_dir(dir));
  for (const DirEntry& e : entries) {
    if (e.is_dir || internal_catalog::validate_checkpoint_name(e.name).ok() == false) continue;
    auto record = read_record(*fs, dir + "/" + e.name);
    if (!record.ok() || record->name() != e.name) continue;  // damaged or foreign: not listed
    TierRecordInfo info;
    info.name = e.name;
    info.step = record->step();
    info.epoch = record->epoch();
    info.commit_seq = record->commit_seq();
    info.nodes = record->tier().nodes_size();
    info.redundancy = record->tier().redundancy();
    info.global = fs->exists(root + "/" + e.name + "/" + internal_format::kIndexFileName);
    info.advances_latest = record->advances_latest();
    out.push_back(info);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.commit_seq > b.commit_seq; });
  return out;
}

Result<RestoreResult> restore(Comm& comm, StateDict& state, const std::string& root, const LocalTier& tier_in,
                              const RestoreOptions& options) {
  using namespace internal_tier;
  const LocalTier tier{node_dir(comm, tier_in.dir, comm.rank()), tier_in.redundancy};
  using internal_comm::agree;
  std::shared_ptr<FileSystem> handle = options.load.fs ? options.load.fs : posix_filesystem();
  const bool use_local = !options.global_only && !tier.dir.empty();
  std::vector<std::string> names;
  Status local;
  if (comm.rank() == 0) {
    local = internal_base::guarded("restore: rank 0", [&]() -> Status {
      // A name becomes paths under the root and the node directories: no "..", no '/'.
      if (!options.name.empty()) DISTCKPT_RETURN_IF_ERROR(internal_catalog::validate_checkpoint_name(options.name));
      DISTCKPT_ASSIGN_OR_RETURN(auto all, candidates(*handle, root, handle, use_local));
      // A default restore starts from, and falls back through, the saves that moved
      // `latest`: never an exception save by itself (resume() starts fresh when there
      // is nothing else). A named restore falls back to any older checkpoint; a name not
      // listed (a damaged record, say) falls back to the default ones.
      const bool listed = std::any_of(all.begin(), all.end(), [&](const Candidate& c) { return c.name == options.name; });
      if (options.name.empty() && options.prefer &&
          std::any_of(all.begin(), all.end(), [&](const Candidate& c) { return c.advances_latest && options.prefer(c.name); }))
        all.erase(std::remove_if(all.begin(), all.end(), [&](const Candidate& c) { return !options.prefer(c.name); }),
                  all.end());
      bool started = options.name.empty() || !listed;
      if (!options.name.empty() && !listed) names.push_back(options.name);
      for (const auto& c : all) {
        if (!started && c.name == options.name) started = true;
        if (!started) continue;
        if ((options.name.empty() || !listed) && !c.advances_latest) continue;
        if (!options.name.empty() && !names.empty() && !options.fall_back) break;
        names.push_back(c.name);
      }
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  std::string joined;
  for (const auto& n : names) joined += n + "\n";
  comm.broadcast_string(joined, 0);
  names.clear();
  for (std::size_t at = 0; at < joined.size();) {
    const auto nl = joined.find('\n', at);
    names.push_back(joined.substr(at, nl - at));
    at = nl + 1;
  }
  if (names.empty()) return not_found("no checkpoint in any tier of '" + root + "'");
  std::vector<std::string> skipped;
  for (const std::string& name : names) {
    auto r = restore_one(comm, state, root, tier, options, name, use_local);
    if (r.ok()) {
      r->skipped = skipped;
      return r;
    }
    if (r.status().code() != StatusCode::kNotFound && r.status().code() != StatusCode::kCorruption) return r.status();
    skipped.push_back(name + ": " + r.status().message());
    if (comm.rank() == 0)
      std::fprintf(stderr, "distckpt: restore: %s cannot be restored (%s); trying an older checkpoint\n", name.c_str(),
                   r.status().message().c_str());
  }
  std::string why;
  for (const auto& s : skipped) why += "\n  " + s;
  return not_found("no checkpoint of '" + root + "' can be restored from any tier:" + why);
}

}  // namespace distckpt
