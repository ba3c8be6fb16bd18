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
#include "storage/object_fs.h"
#include "plan/match.h"
#include "plan/load_staging.h"
#include "collective/save_frame.h"
#include "comm/agree.h"
#include "distckpt/catalog.h"
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

// One attempt at a checkpoint, in named steps (restore_one runs them in order): read
// the indexes, find the copies, match and plan the pieces, stage, fetch (rounds,
// rebuild, the global copy), write back, report. Every step that can fail on one rank
// is agreed before the next.
class RestoreRun {
 public:
  RestoreRun(Comm& comm, StateDict& state, const std::string& root, const LocalTier& tier,
             const RestoreOptions& options, const std::string& name, bool use_local)
      : comm_(comm), state_(state), root_(root), tier_(tier), options_(options), name_(name), use_local_(use_local),
        fs_(*internal_storage::filesystem_for(root, options.load.fs)), me_(comm.rank()),
        where_("restore: rank " + std::to_string(comm.rank())), nodes_(node_map(comm)),
        my_node_(nodes_.node_of[static_cast<std::size_t>(me_)]), leader_(nodes_.leader(my_node_) == me_),
        staged_state_(state.rank()) {
    a_.name = name;
    result_.name = name;
  }

  // Step 1: rank 0 reads the record and the global index; every rank opens and checks
  // them. kNotFound when the name is in no tier. Collective, agreed.
  Status read_indexes();
  // Which node holds which copy of the record's files (node ids read by each node's
  // leader). Collective.
  void find_copies();
  // The pieces: every rank's boxes (from the agreed layouts) against the distinct chunks
  // of the matched tensors. Collective, agreed.
  Status plan_pieces();
  // Tensors to cast, or with strided buffers, are restored, from every source alike,
  // into a packed staging buffer per box (the same state dict with those buffers), and
  // converted and scattered once every byte arrived (plan/load_staging.h). Collective,
  // agreed.
  Status stage();
  // Steps 2-5: rounds until every piece arrived, the parity rebuild when a round makes
  // no progress, then the global copy. kNotFound when pieces are lost beyond every
  // tier. Collective, agreed.
  Status fetch();
  // The staged boxes into the caller's memory. Local.
  void write_back();
  // The sources' totals in the result. Collective (one allreduce).
  RestoreResult report(double seconds);

 private:
  Status rebuild_lost();
  Status add_pieces(int i, const internal_plan::MatchedTensor& m, const proto::Tensor& t);

  Comm& comm_;
  StateDict& state_;
  const std::string& root_;
  const LocalTier& tier_;
  const RestoreOptions& options_;
  const std::string name_;
  const bool use_local_;
  FileSystem& fs_;
  const int me_;
  const std::string where_;
  const NodeMap nodes_;
  const int my_node_;
  const bool leader_;
  Attempt a_;
  RestoreResult result_;
  const proto::Index* described_ = nullptr;  // the record, or else the global index
  std::vector<std::vector<char>> present_;   // per record file, per copy: on its node
  std::map<std::pair<std::string, Box>, int> by_box_;
  // State tensor -> the dtype it is staged in: its stored one (LoadOptions::cast_floats),
  // or its own for strided buffers.
  std::map<int, DType> casts_;
  StateDict staged_state_;
  std::map<int, std::vector<std::vector<char>>> staged_;
  Counters counters_;
};

Status RestoreRun::read_indexes() {
  std::string record_bytes, global_bytes;
  Status local;
  if (me_ == 0) {
    local = guarded(where_, [&]() -> Status {
      if (use_local_ && fs_.exists(record_path(root_, name_))) {
        DISTCKPT_ASSIGN_OR_RETURN(record_bytes, read_whole_file(fs_, record_path(root_, name_), uint64_t{1} << 30));
      }
      if (fs_.exists(root_ + "/" + name_ + "/" + internal_format::kIndexFileName)) {
        DISTCKPT_ASSIGN_OR_RETURN(global_bytes, internal_format::read_index_bytes(fs_, root_ + "/" + name_));
      }
      if (record_bytes.empty() && global_bytes.empty())
        return not_found("checkpoint '" + name_ + "' is in no tier of '" + root_ + "'");
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm_, local));
  comm_.broadcast_string(record_bytes, 0);
  comm_.broadcast_string(global_bytes, 0);
  a_.has_record = !record_bytes.empty();
  a_.has_global = !global_bytes.empty();
  local = guarded(where_, [&]() -> Status {
    if (a_.has_record)
      DISTCKPT_RETURN_IF_ERROR(open_and_check(&a_.record, record_bytes, record_path(root_, name_), options_.load,
                                              &a_.record_cipher, true));
    if (a_.has_global)
      DISTCKPT_RETURN_IF_ERROR(open_and_check(&a_.global, global_bytes, root_ + "/" + name_, options_.load,
                                              &a_.global_cipher, false));
    if (state_.rank() != me_) return invalid_argument("the state dict was built for rank " + std::to_string(state_.rank()));
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm_, local));
  // The same indexes on every rank: the same decision.
  if (a_.has_record && a_.has_global && !is_drained_copy(a_.record, a_.global)) {
    if (me_ == 0)
      std::fprintf(stderr,
                   "distckpt: restore: '%s/%s' is another checkpoint than the local tier's record of that name "
                   "(step, epoch or tensors differ): not used for it\n",
                   root_.c_str(), name_.c_str());
    a_.has_global = false;
    a_.global = proto::Index();
  }
  DISTCKPT_RETURN_IF_ERROR(internal_collective::agree_on_state(comm_, state_));
  described_ = a_.has_record ? &a_.record : &a_.global;
  return Status();
}

void RestoreRun::find_copies() {
  std::string id;
  if (leader_ && use_local_) id = read_node_id(fs_, tier_.dir);
  const std::vector<std::string> ids = comm_.allgather(leader_ ? id : std::string());
  if (!a_.has_record) return;
  a_.current_of.assign(static_cast<std::size_t>(a_.record.tier().nodes_size()), -1);
  for (int rn = 0; rn < a_.record.tier().nodes_size(); ++rn)
    for (int n = 0; n < nodes_.count; ++n)
      if (!ids[static_cast<std::size_t>(nodes_.leader(n))].empty() &&
          ids[static_cast<std::size_t>(nodes_.leader(n))] == a_.record.tier().nodes(rn).node_id())
        a_.current_of[static_cast<std::size_t>(rn)] = n;
  std::vector<int64_t> flags;
  for (int f = 0; f < a_.record.tier().files_size(); ++f)
    for (const proto::TierCopy& c : a_.record.tier().files(f).copies()) {
      int64_t here = 0;
      if (leader_ && a_.current_of[c.node()] == my_node_) {
        auto size = fs_.file_size(copy_path(tier_.dir, name_, a_.record.files(f).name(), c.kind()));
        here = size.ok() && *size >= c.bytes() ? 1 : 0;
      }
      flags.push_back(here);
    }
  comm_.allreduce(flags, ReduceOp::kMax);
  std::size_t at = 0;
  for (int f = 0; f < a_.record.tier().files_size(); ++f) {
    present_.emplace_back();
    for (int k = 0; k < a_.record.tier().files(f).copies_size(); ++k) present_.back().push_back(flags[at++] ? 1 : 0);
  }
}

Status RestoreRun::plan_pieces() {
  Status local = guarded(where_, [&]() -> Status {
    // The load's filters and renames, as a global load applies them; shapes exactly as
    // stored (the record's and the global index's chunks are matched by their boxes).
    proto::Index& described = a_.has_record ? a_.record : a_.global;
    internal_plan::MatchRules rules;
    rules.checkpoint = name_;
    rules.reshape_trailing_ones = false;
    // Each tensor's pieces as soon as it matched, before the next (as a load checks its files).
    rules.on_match = [&](const internal_plan::MatchedTensor& m) -> Status {
      if (m.staged_dtype) casts_[m.state] = *m.staged_dtype;
      DISTCKPT_RETURN_IF_ERROR(add_pieces(m.state, m, described.tensors(m.stored)));
      result_.load.loaded.push_back(state_.tensors()[static_cast<std::size_t>(m.state)].name);
      return Status();
    };
    DISTCKPT_ASSIGN_OR_RETURN(internal_plan::Matching matching,
                              internal_plan::match_state(state_, described, options_.load, rules));
    result_.load.filtered_out = matching.names.filtered_out;
    result_.load.missing_in_checkpoint = std::move(matching.missing_in_checkpoint);
    result_.load.unexpected_in_checkpoint = std::move(matching.unexpected_in_checkpoint);
    return Status();
  });
  return agree(comm_, local);
}

// The distinct boxes of stored tensor `t`, and the pieces every rank needs of them.
Status RestoreRun::add_pieces(int i, const internal_plan::MatchedTensor& m, const proto::Tensor& t) {
  const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(i)];
  proto::Tensor dedup;
  *dedup.mutable_global_shape() = t.global_shape();
  std::vector<int> dedup_id;
  for (const proto::Chunk& ch : t.chunks()) {
    const Box b = internal_format::chunk_box(ch);
    // Keyed by the stored name: add_copies looks chunks up in the record and the
    // global index, which know no renames.
    auto [pos, fresh] = by_box_.emplace(std::make_pair(t.name(), b), static_cast<int>(a_.distinct.size()));
    if (fresh) {
      Distinct d;
      d.record_tensor = m.stored;
      d.box = b;
      d.plain_bytes = static_cast<uint64_t>(b.num_elements()) * dtype_size(m.read_dtype);
      a_.distinct.push_back(d);
      *dedup.add_chunks() = ch;
      dedup_id.push_back(pos->second);
    }
  }
  const internal_plan::ChunkLookup lookup(dedup);
  for (int r = 0; r < comm_.size(); ++r) {
    const std::vector<Box> boxes = e.layout.boxes_of(r);
    for (std::size_t b = 0; b < boxes.size(); ++b) {
      if (boxes[b].num_elements() == 0) continue;
      int64_t covered = 0;
      for (const auto& read : lookup.plan_reads(boxes[b], &covered)) {
        Piece p;
        p.state_tensor = i;
        p.rank = r;
        p.box = static_cast<int>(b);
        p.distinct = dedup_id[static_cast<std::size_t>(read.chunk)];
        p.region = read.region;
        p.bytes = static_cast<uint64_t>(read.region.num_elements()) * dtype_size(m.read_dtype);
        a_.pieces.push_back(p);
      }
      if (covered != boxes[b].num_elements())
        return corruption("tensor '" + e.name + "': checkpoint '" + name_ + "' does not cover box " +
                          boxes[b].to_string());
    }
  }
  return Status();
}

Status RestoreRun::stage() {
  Status local = guarded(where_, [&]() -> Status {
    if (casts_.empty()) return Status();
    for (std::size_t i = 0; i < state_.tensors().size(); ++i) {
      const TensorEntry& e = state_.tensors()[i];
      auto it = casts_.find(static_cast<int>(i));
      if (it == casts_.end()) {
        DISTCKPT_RETURN_IF_ERROR(staged_state_.add_view(e));
        continue;
      }
      std::vector<void*> buffers;
      for (const Box& box : e.boxes) {
        staged_[it->first].emplace_back(static_cast<std::size_t>(box.num_elements()) * dtype_size(it->second));
        buffers.push_back(staged_[it->first].back().data());
      }
      DISTCKPT_RETURN_IF_ERROR(staged_state_.add_tensor(e.name, it->second, std::move(buffers), e.layout));
    }
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm_, local));
  if (a_.has_record) add_copies(a_, a_.record, false, by_box_, present_);
  return Status();
}

// Step 4. Record nodes whose copies were all lost or failed count as lost. Agreed on
// every rank. Whatever failed (a damaged parity, a full disk for the rebuilt files,
// memory), the global copy may still have the bytes: the caller goes on to it.
Status RestoreRun::rebuild_lost() {
  std::set<int> lost;
  for (int rn = 0; rn < a_.record.tier().nodes_size(); ++rn) {
    if (a_.current_of[static_cast<std::size_t>(rn)] < 0) {
      lost.insert(rn);
      continue;
    }
    for (int f : stream_files(a_.record, rn))
      for (const Copy& c : a_.copies)
        if (!c.global && c.file == f && c.kind == kPrimary && !c.usable) lost.insert(rn);
    for (int f : stream_files(a_.record, rn))
      if (!present_[static_cast<std::size_t>(f)][0]) lost.insert(rn);
  }
  auto red = record_redundancy(a_.record);
  internal_base::Timer rebuild_timer;
  Status st = red.ok() ? rebuild(comm_, fs_, a_, tier_, nodes_, *red, lost, &counters_) : red.status();
  result_.rebuild_s = rebuild_timer.seconds();
  return st;
}

Status RestoreRun::fetch() {
  StateDict& target = casts_.empty() ? state_ : staged_state_;
  std::vector<int> pending(a_.pieces.size());
  for (std::size_t i = 0; i < pending.size(); ++i) pending[i] = static_cast<int>(i);
  Status fatal;
  bool rebuilt = false, global_added = false;
  internal_base::Timer read_timer;
  while (!pending.empty()) {
    const std::size_t before = pending.size();
    pending = run_round(comm_, target, a_, tier_, root_, fs_, pending, nodes_, &counters_, &fatal);
    if (!fatal.ok()) return fatal;
    if (pending.empty()) break;
    if (pending.size() < before) continue;  // progress: plan what is left again
    if (!rebuilt && a_.has_record && a_.record.tier().groups_size() > 0) {
      rebuilt = true;
      const Status st = rebuild_lost();
      if (!st.ok() && me_ == 0)
        std::fprintf(stderr, "distckpt: restore '%s': parity rebuild: %s\n", name_.c_str(), st.to_string().c_str());
      continue;
    }
    if (!global_added && a_.has_global) {
      global_added = true;
      add_copies(a_, a_.global, true, by_box_, present_);
      continue;
    }
    return not_found("checkpoint '" + name_ + "': " + std::to_string(pending.size()) +
                     " pieces of state are lost beyond its redundancy (" +
                     (a_.has_record ? a_.record.tier().redundancy() : std::string("no local tier")) + ") and " +
                     (a_.has_global ? "the global copy failed" : "it was not drained to the global root"));
  }
  result_.load.read_s = read_timer.seconds();
  return Status();
}

void RestoreRun::write_back() {
  for (const auto& [i, from] : casts_) {
    const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(i)];
    for (std::size_t b = 0; b < e.boxes.size(); ++b) internal_plan::write_back(e, b, staged_.at(i)[b].data(), from);
  }
}

RestoreResult RestoreRun::report(double seconds) {
  const RestoreSources& s = counters_.sources;
  std::vector<int64_t> totals{static_cast<int64_t>(s.local),       static_cast<int64_t>(s.peer),
                              static_cast<int64_t>(s.parity),      static_cast<int64_t>(s.global),
                              static_cast<int64_t>(s.parity_read), static_cast<int64_t>(s.storage_read),
                              static_cast<int64_t>(counters_.needed)};
  comm_.allreduce(totals, ReduceOp::kSum);
  RestoreSources& out = result_.sources;
  out.local = static_cast<uint64_t>(totals[0]);
  out.peer = static_cast<uint64_t>(totals[1]);
  out.parity = static_cast<uint64_t>(totals[2]);
  out.global = static_cast<uint64_t>(totals[3]);
  out.parity_read = static_cast<uint64_t>(totals[4]);
  out.storage_read = static_cast<uint64_t>(totals[5]);
  for (const Copy& c : a_.copies)
    if (!c.usable) ++out.lost_chunks;
  result_.load.bytes_read = out.storage_read;
  result_.load.bytes_needed = static_cast<uint64_t>(totals[6]);
  result_.load.step = described_->step();
  result_.load.epoch = described_->epoch();
  result_.load.info = internal_format::info_values(*described_);
  result_.load.load_s = seconds;
  return std::move(result_);
}

// One attempt at `name`. kNotFound when the bytes are lost beyond every tier.
Result<RestoreResult> restore_one(Comm& comm, StateDict& state, const std::string& root, const LocalTier& tier,
                                  const RestoreOptions& options, const std::string& name, bool use_local) {
  internal_base::Timer timer;
  RestoreRun run(comm, state, root, tier, options, name, use_local);
  DISTCKPT_RETURN_IF_ERROR(run.read_indexes());
  run.find_copies();
  DISTCKPT_RETURN_IF_ERROR(run.plan_pieces());
  DISTCKPT_RETURN_IF_ERROR(run.stage());
  DISTCKPT_RETURN_IF_ERROR(run.fetch());
  run.write_back();
  return run.report(timer.seconds());
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
  std::shared_ptr<FileSystem> handle = internal_storage::filesystem_for(root, options.load.fs);
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
