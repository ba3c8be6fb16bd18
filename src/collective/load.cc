// Collective load: rank 0 resolves the checkpoint and reads its description once; every
// rank parses and validates it, then reads only the chunks that overlap its boxes
// through the read engine (format/chunk_reader.h), and replicas may share reads.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "base/guard.h"
#include "base/strings.h"
#include "base/timer.h"
#include "collective/exchange.h"
#include "collective/fetch_index.h"
#include "collective/load_checks.h"
#include "plan/match.h"
#include "plan/load_staging.h"
#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "distckpt/catalog.h"
#include "format/chunk_reader.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "format/stored.h"
#include "layout/region.h"
#include "plan/load_plan.h"
#include "plan/save_plan.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt {

using internal_base::guarded;
using internal_comm::agree;
using internal_format::FileCache;

namespace {

// Checks, without reading data, that the checkpoint covers every box of `e` and that
// the files those chunks live in exist with their recorded sizes.
Status check_sources(FileCache& files, const proto::Tensor& t, const internal_plan::ChunkLookup& lookup,
                     const TensorEntry& e) {
  for (const Box& needed : e.boxes) {
    if (needed.num_elements() == 0) continue;
    int64_t covered = 0;
    for (const auto& r : lookup.plan_reads(needed, &covered))
      DISTCKPT_RETURN_IF_ERROR(files.get(t.chunks(r.chunk).file_id()).status().with_context("tensor '" + t.name() + "'"));
    if (covered != needed.num_elements())
      return corruption("tensor '" + t.name() + "': the checkpoint covers " + std::to_string(covered) + " of the " +
                        std::to_string(needed.num_elements()) + " elements of box " + needed.to_string());
  }
  return Status();
}

// What ranks compare to decide whether replicas may share reads. Every rank must want
// it (its options, and no buffer of its planned boxes used twice: tied weights would
// make a rank receive into a buffer it also sends from) and every rank must load the
// same tensors, with the same dtypes and layouts (rank lists and explicit boxes
// included), in the same order, so that each member of a replica group derives the
// same reader for each box, from the same stored tensors (filters and renames are each
// rank's own). The words go into phase 1's agreement (one allreduce decides, so all
// ranks take the same path); a rank that does not want sharing sends no fingerprint.
std::vector<int64_t> share_words(const StateDict& state, const proto::Index& index,
                                 const std::vector<std::pair<int, int>>& plan, bool wanted) {
  if (!wanted) return {0, 0};
  std::string signature;
  std::set<void*> buffers;
  bool tied = false;
  for (const auto& [i, t] : plan) {
    const TensorEntry& e = state.tensors()[i];
    proto::Tensor described;  // compact: O(1) for a device-matrix layout over a contiguous group
    internal_plan::describe_tensor(internal_plan::PlannedTensor{e.name, e.dtype, &e.layout}, true, &described);
    signature += described.SerializeAsString();
    // And the stored tensor it loads from: ranks whose filters or renames differ must
    // not share (a reader would send another tensor, or another dtype's bytes).
    signature += index.tensors(t).name() + '\0' + index.tensors(t).dtype() + '\0';
    for (std::size_t b = 0; b < e.buffers.size(); ++b)
      if (e.boxes[b].num_elements() > 0 && !buffers.insert(e.buffers[b]).second) tied = true;
  }
  if (tied) return {0, 0};
  return {static_cast<int64_t>(std::hash<std::string>{}(signature)), 1};
}

// One box of a tensor this rank loads, and who reads it.
struct BoxRead {
  int i, t;  // state tensor, stored tensor
  std::size_t b;
  std::vector<internal_plan::ReadItem> reads;
  uint64_t bytes;
  int reader;
};

// One load between its named steps (load() runs them in order): match, verify, plan,
// fetch, exchange, agree, write back, report.
class LoadRun {
 public:
  LoadRun(Comm& comm, StateDict& state, const std::string& path, const LoadOptions& options)
      : comm_(comm), state_(state), options_(options), where_("load: rank " + std::to_string(comm.rank())) {
    // With a key, a .ckpt encrypted whole reads as its plaintext.
    fs_ = internal_format::with_key(internal_storage::filesystem_for(path, options.fs), options.key.get());
  }
  const std::string& where() const { return where_; }
  std::shared_ptr<FileSystem> fs_handle() const { return fs_; }
  LoadResult& result() { return result_; }
  bool share() const { return share_; }

  void set_checkpoint(internal_collective::FetchedIndex fetched) {
    dir_ = fetched.path;
    index_ = std::move(fetched.index);
  }

  // Phase 1, metadata only: every check that can fail on a well-formed checkpoint
  // (names, dtypes, shapes, coverage, files present with the recorded sizes) runs
  // before any byte lands in the caller's buffers, and ranks agree on it (one
  // allreduce, which also decides whether replicas share reads). Only a checksum or
  // chunk authentication error found while reading can leave buffers partly written.
  // Collective.
  Status match() {
    Status local = guarded(where_, [&] { return match_local(); });
    const internal_comm::Compared agreed = internal_comm::agree_same(comm_, local, sharing_);
    // Only after a failure does a second round carry the lowest failing rank's message.
    if (agreed.failed) return agree(comm_, local.with_context(where_));
    share_ = agreed.same && sharing_[1] == 1;
    return Status();
  }

  // The checks the reads alone would not make. A whole-file CRC-32 (a .ckpt's footer)
  // is read whole for a single file; a per-rank set's chunks are checked as they are
  // read, like native. A single file's footer is checked whole as well: it covers the
  // structure around the chunks, and a file MindSpore would refuse is damaged. A part
  // of a chunk is read alone (not checked: the chunk's CRC32C covers all of it), unless
  // check_partial_chunks asks; so a single file's tensor (one chunk) that no rank reads
  // whole is checked first, by one rank (a native chunk is one slice: loads onto the
  // saved layout read each whole). Collective.
  Status verify() {
    const bool single = internal_format::is_single_file(index_);
    if (!internal_format::has_chunk_checksums(index_) || single)
      DISTCKPT_RETURN_IF_ERROR(internal_collective::check_file_crc32(comm_, *files_, index_, where_));
    if (!options_.check_partial_chunks && internal_format::has_chunk_checksums(index_) && single)
      DISTCKPT_RETURN_IF_ERROR(internal_collective::check_unread_chunks(comm_, *files_, index_, state_, plan_, where_));
    return Status();
  }

  // 2a: who reads each box, and the messages. With shared reads, each box needed by
  // several replicas is read by one of them (ReplicaGroups::assign: each member a
  // stretch of the files in storage order, the same choice on every member) and sent to
  // the others; the ranks agree on the plan before any message is posted, so that each
  // posts all it listed. Collective (agreed) when sharing; local otherwise.
  Status plan() {
    read_timer_ = internal_base::Timer();  // read_s counts the plan, as the reads' part
    Status local = guarded(where_, [&] { return plan_local(); });
    if (share_) return agree(comm_, local.with_context(where_));
    return local;
  }

  // 2b: every receive posted first; each send as soon as its box is read and checked,
  // while the reads go on (collective/exchange.h). A failure is returned after the
  // exchange is settled (every send posted, every message waited for), so that no peer
  // waits for a message that never comes. Local reads; the exchange pairs with the peers'.
  Status fetch_and_exchange() {
    if (share_) exchange_.start(comm_, boxes_.size());
    Status local = guarded(where_, [&] { return fetch(); });
    result_.read_s = read_timer_.seconds();
    result_.rank_small_runs = small_.runs;
    internal_base::Timer exchange_timer;
    exchange_.finish();
    result_.exchange_s = exchange_timer.seconds();
    return local;
  }

  // After the agreement: the staged boxes into the caller's memory, one at a time (the
  // peak stays one copy of the staged boxes). Local.
  void write_back() {
    for (auto& [at, buffer] : staged_) {
      const auto [i, b] = at;
      internal_plan::write_back(state_.tensors()[static_cast<std::size_t>(i)], b, buffer.get(), staged_dtypes_.at(i));
      buffer.reset();
    }
  }

  // The job's totals in the result. Collective (one allreduce).
  void report();

 private:
  Status match_local();
  bool reads_directly();
  Status plan_local();
  Status fetch();
  Status read_box(std::size_t k, std::vector<char>& scratch, std::vector<uint32_t>& pending);

  DType dtype_read(int i) const {
    auto it = staged_dtypes_.find(i);
    return it != staged_dtypes_.end() ? it->second : state_.tensors()[static_cast<std::size_t>(i)].dtype;
  }
  // Where box `b` of state tensor `i` is read to: the caller's buffer, or a staging
  // buffer made as a box first needs one (not zeroed: every byte is read into it first).
  void* buffer_read(int i, std::size_t b) {
    const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(i)];
    auto from = staged_dtypes_.find(i);
    if (from == staged_dtypes_.end()) return e.buffers[b];
    std::unique_ptr<unsigned char[]>& buffer = staged_[{i, b}];
    if (!buffer)
      buffer.reset(new unsigned char[std::max<std::size_t>(1, static_cast<std::size_t>(e.boxes[b].num_elements()) *
                                                                  dtype_size(from->second))]);
    return buffer.get();
  }
  // Lets messages move while pieces of 256 KiB are copied.
  void meanwhile() { exchange_.progress(); }

  Comm& comm_;
  StateDict& state_;
  const LoadOptions& options_;
  const std::string where_;
  std::shared_ptr<FileSystem> fs_;
  std::string dir_;
  proto::Index index_;
  LoadResult result_;
  std::vector<std::pair<int, int>> plan_;  // (state-dict tensor, index tensor)
  // State-dict tensor -> the dtype it is read in, for tensors read into staging buffers:
  // a cast (cast_floats: the stored dtype) or strided buffers (its own dtype).
  std::map<int, DType> staged_dtypes_;
  std::map<int, internal_plan::ChunkLookup> lookups_;  // by index tensor
  std::unique_ptr<FileCache> files_;
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher_;
  // Those tensors are read (and shared between replicas) into packed staging buffers,
  // converted and scattered into the caller's buffers once every read succeeded. A
  // strided box read by this rank alone, without a cast, goes through one reused buffer
  // instead, scattered as soon as it is read (as other boxes are read straight into the
  // caller's memory), so its staging is one box, not the tensor.
  std::map<std::pair<int, std::size_t>, std::unique_ptr<unsigned char[]>> staged_;
  std::vector<char> box_scratch_;
  // Chunks needed whole that are read directly, gathered while reading and read after.
  // Only where chunks carry their own CRC32C (native, safetensors and HDF5 files distckpt
  // wrote): a single file checked by a whole-file CRC (a .ckpt) has just been read
  // through the page cache.
  internal_format::GatheredReads gathered_;
  bool gathers_ = false;
  std::vector<int64_t> sharing_{0, 0};
  bool share_ = false;
  internal_format::SmallRuns small_;
  std::vector<BoxRead> boxes_;
  std::set<std::size_t> exchanged_;  // boxes sent or received: read into whole buffers
  internal_collective::ReadExchange exchange_;  // items: boxes_
  internal_base::Timer read_timer_;
};

Status LoadRun::match_local() {
  const std::string source = dir_;
  dir_ = internal_format::files_dir(index_, dir_);
  DISTCKPT_ASSIGN_OR_RETURN(cipher_, internal_format::open_index(&index_, options_.key.get(), source));
  DISTCKPT_RETURN_IF_ERROR(internal_format::check_unchecked(index_, source, options_.allow_unchecked, &result_.warning));
  if (state_.rank() != comm_.rank())
    return invalid_argument("the state dict was built for rank " + std::to_string(state_.rank()));
  gathers_ = options_.direct_reads && internal_format::has_chunk_checksums(index_);
  small_.sieve = options_.sieve_small_runs;
  files_ = std::make_unique<FileCache>(*fs_, dir_, index_);
  internal_plan::MatchRules rules;
  rules.checkpoint = dir_;
  // Each tensor's chunks and files are checked as soon as it matched, before the next.
  rules.on_match = [&](const internal_plan::MatchedTensor& m) -> Status {
    if (m.staged_dtype) staged_dtypes_[m.state] = *m.staged_dtype;
    const proto::Tensor& t = index_.tensors(m.stored);
    auto lookup = lookups_.emplace(m.stored, internal_plan::ChunkLookup(t)).first;
    DISTCKPT_RETURN_IF_ERROR(check_sources(*files_, t, lookup->second, state_.tensors()[static_cast<std::size_t>(m.state)]));
    plan_.emplace_back(m.state, m.stored);
    return Status();
  };
  DISTCKPT_ASSIGN_OR_RETURN(internal_plan::Matching matching, internal_plan::match_state(state_, index_, options_, rules));
  result_.filtered_out = matching.names.filtered_out;
  result_.missing_in_checkpoint = std::move(matching.missing_in_checkpoint);
  result_.unexpected_in_checkpoint = std::move(matching.unexpected_in_checkpoint);
  const bool wants_sharing =
      comm_.size() > 1 &&
      (options_.replica_reads == LoadOptions::ReplicaReads::kShared ||
       (options_.replica_reads == LoadOptions::ReplicaReads::kAuto && (comm_.node_count() > 1 || reads_directly())));
  sharing_ = share_words(state_, index_, plan_, wants_sharing);
  return Status();
}

// Whether this load reads directly, by its first box (the reads ask again for each chunk
// and file): a chunk needed whole, not encrypted, of a file that reads directly. If
// ranks answer differently, they do not share (share_words).
bool LoadRun::reads_directly() {
  if (!gathers_ || plan_.empty() || cipher_ != nullptr) return false;
  const auto& [i, t] = plan_.front();
  const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(i)];
  if (e.boxes.empty()) return false;
  int64_t covered = 0;
  const std::vector<internal_plan::ReadItem> reads = lookups_.at(t).plan_reads(e.boxes.front(), &covered);
  return reads.size() == 1 && reads.front().whole &&
         gathered_.reads_directly(*files_, index_.tensors(t).chunks(reads.front().chunk).file_id());
}

Status LoadRun::plan_local() {
  internal_plan::ReplicaGroups groups(comm_.rank());
  struct Shared {
    uint32_t file;
    uint64_t offset;  // where the box's stored bytes start
    int box;          // in `boxes_`
    int number;       // in `groups`
  };
  std::vector<Shared> shared;
  for (const auto& [i, t] : plan_) {
    const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(i)];
    const int g = share_ && e.layout.group_index(comm_.rank()) >= 0 ? groups.group_of(e.layout) : -1;
    const bool grouped = g >= 0 && groups.members(g).size() > 1 && groups.members(g).back() < comm_.size();
    for (std::size_t b = 0; b < e.boxes.size(); ++b) {
      int64_t covered = 0;  // checked in phase 1
      BoxRead box{i, t, b, lookups_.at(t).plan_reads(e.boxes[b], &covered),
                  static_cast<uint64_t>(e.boxes[b].num_elements()) * dtype_size(dtype_read(i)), comm_.rank()};
      if (grouped && box.bytes > 0) {
        const proto::Chunk& first = index_.tensors(t).chunks(box.reads.front().chunk);
        shared.push_back(Shared{first.file_id(), first.byte_offset(), static_cast<int>(boxes_.size()),
                                groups.need(g, first.file_id(), first.byte_offset(), box.bytes)});
      }
      boxes_.push_back(std::move(box));
    }
  }
  groups.assign();
  // Messages in storage order, the order the reader reads its gathered chunks in, so
  // that each send can go as soon as its box is read. Every member lists the group's
  // boxes in the same relative order, so both ends of each pair sort alike.
  std::stable_sort(shared.begin(), shared.end(), [](const Shared& a, const Shared& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  for (const Shared& one : shared) {
    const auto k = static_cast<std::size_t>(one.box);
    BoxRead& box = boxes_[k];
    box.reader = groups.reader(one.number);
    exchanged_.insert(k);
    void* buffer = buffer_read(box.i, box.b);
    if (box.reader != comm_.rank()) {
      exchange_.add_receive({box.reader, buffer, box.bytes});
      continue;
    }
    for (int member : groups.members_of(one.number))
      if (member != comm_.rank()) {
        exchange_.add_send(static_cast<int>(k), {member, buffer, box.bytes});
        if (comm_.node_of(member) != comm_.node_of(comm_.rank())) result_.rank_bytes_between_hosts += box.bytes;
      }
  }
  return Status();
}

// Reads box `k` (this rank its reader): a strided box read alone through the reused
// scratch, written back at once; any other straight into its buffer, its whole chunks
// gathered for direct reads (`pending[k]` counts them).
Status LoadRun::read_box(std::size_t k, std::vector<char>& scratch, std::vector<uint32_t>& pending) {
  const BoxRead& box = boxes_[k];
  const bool check_partial = options_.check_partial_chunks;
  gathered_.tag = static_cast<int64_t>(k);
  const std::size_t gathered_before = gathered_.size();
  const TensorEntry& e = state_.tensors()[static_cast<std::size_t>(box.i)];
  if (e.strided() && dtype_read(box.i) == e.dtype && !exchanged_.count(k)) {
    if (box_scratch_.size() < box.bytes) box_scratch_.resize(box.bytes);
    DISTCKPT_RETURN_IF_ERROR(internal_format::read_into(*files_, index_, index_.tensors(box.t), box.reads,
                                                        e.boxes[box.b], box_scratch_.data(), scratch,
                                                        &result_.rank_bytes_read, check_partial, cipher_.get(),
                                                        &small_, nullptr));
    internal_plan::write_back(e, box.b, box_scratch_.data(), e.dtype);
    result_.rank_bytes_needed += box.bytes;
    exchange_.ready(static_cast<int>(k));  // (nothing to send: not exchanged)
    return Status();
  }
  DISTCKPT_RETURN_IF_ERROR(internal_format::read_into(*files_, index_, index_.tensors(box.t), box.reads,
                                                      e.boxes[box.b], buffer_read(box.i, box.b), scratch,
                                                      &result_.rank_bytes_read, check_partial, cipher_.get(), &small_,
                                                      gathers_ ? &gathered_ : nullptr));
  result_.rank_bytes_needed += box.bytes;
  pending[k] = static_cast<uint32_t>(gathered_.size() - gathered_before);
  if (pending[k] == 0) {  // read now, not gathered: it may go
    exchange_.ready(static_cast<int>(k));
    meanwhile();
  }
  return Status();
}

Status LoadRun::fetch() {
  std::vector<char> scratch;
  std::vector<uint32_t> pending(boxes_.size(), 0);  // per box: its chunks gathered, not read yet
  for (std::size_t k = 0; k < boxes_.size(); ++k)
    if (boxes_[k].reader == comm_.rank()) DISTCKPT_RETURN_IF_ERROR(read_box(k, scratch, pending));
  DISTCKPT_RETURN_IF_ERROR(internal_format::read_gathered(
      *files_, gathered_, internal_format::has_chunk_checksums(index_),
      [&](int64_t tag) {
        if (--pending[static_cast<std::size_t>(tag)] == 0) exchange_.ready(static_cast<int>(tag));
      },
      [&] { meanwhile(); }, &result_.rank_bytes_read_direct));
  for (const auto& [i, t] : plan_) result_.loaded.push_back(state_.tensors()[static_cast<std::size_t>(i)].name);
  result_.step = index_.step();
  result_.epoch = index_.epoch();
  result_.info = internal_format::info_values(index_);
  return Status();
}

void LoadRun::report() {
  // Small pieces by the way they were read, so that every rank reports all of them.
  static constexpr std::string_view kSmallMethods[] = {"io_uring", "pread", "sieving"};
  LoadResult& r = result_;
  std::vector<int64_t> totals{static_cast<int64_t>(r.rank_bytes_read), static_cast<int64_t>(r.rank_bytes_needed),
                              static_cast<int64_t>(r.rank_bytes_between_hosts), 0, 0, 0,
                              static_cast<int64_t>(r.rank_bytes_read_direct)};
  for (std::size_t m = 0; m < std::size(kSmallMethods); ++m)
    if (small_.method == kSmallMethods[m]) totals[3 + m] = static_cast<int64_t>(small_.runs);
  comm_.allreduce(totals, ReduceOp::kSum);
  r.bytes_read = static_cast<uint64_t>(totals[0]);
  r.bytes_needed = static_cast<uint64_t>(totals[1]);
  r.bytes_between_hosts = static_cast<uint64_t>(totals[2]);
  r.bytes_read_direct = static_cast<uint64_t>(totals[6]);
  for (std::size_t m = 0; m < std::size(kSmallMethods); ++m)
    if (totals[3 + m] > 0) {
      r.small_runs += static_cast<uint64_t>(totals[3 + m]);
      r.small_reads += (r.small_reads.empty() ? "" : "+") + std::string(kSmallMethods[m]);
    }
}

}  // namespace

Result<LoadResult> load(Comm& comm, StateDict& state, const std::string& path, const LoadOptions& options) {
  internal_base::Timer timer;
  LoadRun run(comm, state, path, options);
  // Rank 0 resolves the path and reads the index; everyone parses the same bytes.
  DISTCKPT_ASSIGN_OR_RETURN(internal_collective::FetchedIndex fetched,
                            internal_collective::fetch_index(comm, run.fs_handle(), path, run.where()));
  run.set_checkpoint(std::move(fetched));
  DISTCKPT_RETURN_IF_ERROR(run.match());
  DISTCKPT_RETURN_IF_ERROR(run.verify());
  // A plan is agreed when replicas share (no message may be posted by one side alone);
  // otherwise a rank's failure to plan joins the agreement after the reads.
  const Status planned = run.plan();
  if (run.share()) DISTCKPT_RETURN_IF_ERROR(planned);
  const Status fetched_here = planned.ok() ? run.fetch_and_exchange() : planned;
  DISTCKPT_RETURN_IF_ERROR(agree(comm, fetched_here.with_context(run.where())));
  run.write_back();
  run.report();
  run.result().load_s = timer.seconds();
  return std::move(run.result());
}

}  // namespace distckpt
