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
#include "collective/fetch_index.h"
#include "collective/load_checks.h"
#include "plan/load_names.h"
#include "plan/load_staging.h"
#include "layout/strided.h"
#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "distckpt/inspect.h"
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
#include "transform/float_cast.h"
#include "format/ckpt/framed_file.h"

namespace distckpt {

using internal_base::guarded;
using internal_comm::agree;
using internal_format::FileCache;

namespace {

std::string shape_str(const Shape& s) { return full_box(s).to_string(); }

// Whether two global shapes differ only by trailing dims of size 1 ([12,2048,1,1] and
// [12,2048]): the same elements in the same row-major order. MindSpore accepts a
// checkpoint shape with extra trailing 1s (its _special_process_par, for GE's 4-D
// tensors); the other direction is the same bytes, so it is accepted too.
bool same_up_to_trailing_ones(const Shape& a, const Shape& b) {
  const Shape& longer = a.size() >= b.size() ? a : b;
  const Shape& shorter = a.size() >= b.size() ? b : a;
  if (!std::equal(shorter.begin(), shorter.end(), longer.begin())) return false;
  return std::all_of(longer.begin() + static_cast<std::ptrdiff_t>(shorter.size()), longer.end(),
                     [](int64_t d) { return d == 1; });
}

// Rewrites a stored tensor's shape and chunk boxes to `to` (same_up_to_trailing_ones):
// trailing dims of size 1 are dropped or added (offset 0, extent 1). A chunk whose
// dropped dim is not offset 0, extent 1 (an empty chunk, say) would change meaning.
Status reshape_trailing_ones(proto::Tensor& t, const Shape& to) {
  const int n = static_cast<int>(to.size());
  for (const proto::Chunk& c : t.chunks())
    for (int d = n; d < c.shape_size(); ++d)
      if (c.offset(d) != 0 || c.shape(d) != 1)
        return corruption("tensor '" + t.name() + "': a chunk of extent " + std::to_string(c.shape(d)) + " at " +
                          std::to_string(c.offset(d)) + " in dim " + std::to_string(d) +
                          " of size 1 cannot be reshaped");
  t.clear_global_shape();
  for (int64_t d : to) t.add_global_shape(d);
  for (proto::Chunk& c : *t.mutable_chunks()) {
    c.mutable_offset()->Truncate(std::min(n, c.offset_size()));
    c.mutable_shape()->Truncate(std::min(n, c.shape_size()));
    while (c.offset_size() < n) c.add_offset(0);
    while (c.shape_size() < n) c.add_shape(1);
  }
  return Status();
}

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

// The sends of shared replica reads, posted as their boxes are read. To each peer they
// go in the order listed, the order in which the peer posted its receives (messages
// between two ranks match in posting order): a send is posted once its box is read and
// every earlier send to that peer is posted.
class Outbox {
 public:
  // In the order of the plan; `box` numbers the box (0 .. size_boxes() - 1).
  void add(int box, const Comm::Transfer& t) {
    by_peer_[t.peer].push_back(out_.size());
    out_.push_back(Out{t, box});
  }
  void size_boxes(std::size_t boxes) {
    read_.assign(boxes, 0);
    of_box_.assign(boxes, {});
    for (std::size_t o = 0; o < out_.size(); ++o) of_box_[static_cast<std::size_t>(out_[o].box)].push_back(o);
  }
  void start(Comm::Exchange* exchange) { exchange_ = exchange; }
  // Box `box` is read and checked.
  void ready(int box) {
    if (exchange_ == nullptr) return;
    read_[static_cast<std::size_t>(box)] = 1;
    for (std::size_t o : of_box_[static_cast<std::size_t>(box)]) post_ready(out_[o].t.peer);
  }
  // Every send not posted yet, read or not.
  void post_rest() {
    for (auto& [peer, outs] : by_peer_)
      for (std::size_t& next = next_[peer]; next < outs.size(); ++next) exchange_->post_send(out_[outs[next]].t);
  }

 private:
  void post_ready(int peer) {
    const std::vector<std::size_t>& outs = by_peer_[peer];
    std::size_t& next = next_[peer];
    while (next < outs.size() && read_[static_cast<std::size_t>(out_[outs[next]].box)]) exchange_->post_send(out_[outs[next++]].t);
  }
  struct Out {
    Comm::Transfer t;
    int box;
  };
  std::vector<Out> out_;
  std::map<int, std::vector<std::size_t>> by_peer_;  // indexes into out_, in order
  std::map<int, std::size_t> next_;                  // per peer: the first not posted
  std::vector<std::vector<std::size_t>> of_box_;
  std::vector<char> read_;
  Comm::Exchange* exchange_ = nullptr;
};

}  // namespace

Result<LoadResult> load(Comm& comm, StateDict& state, const std::string& path, const LoadOptions& options) {
  internal_base::Timer timer;
  // With a key, a .ckpt encrypted whole reads as its plaintext.
  std::shared_ptr<FileSystem> fs = internal_format::with_key(options.fs ? options.fs : posix_filesystem(), options.key.get());
  const std::string where = "load: rank " + std::to_string(comm.rank());

  // Rank 0 resolves the path and reads the index; everyone parses the same bytes.
  DISTCKPT_ASSIGN_OR_RETURN(internal_collective::FetchedIndex fetched,
                            internal_collective::fetch_index(comm, fs, path, where));
  std::string dir = fetched.path;
  Status local;

  // Phase 1, metadata only: every check that can fail on a well-formed checkpoint
  // (names, dtypes, shapes, coverage, files present with the recorded sizes) runs
  // before any byte lands in the caller's buffers, and ranks agree on it. Only a
  // checksum or chunk authentication error found while reading (phase 2) can leave
  // buffers partly written.
  LoadResult result;
  proto::Index index = std::move(fetched.index);
  std::vector<std::pair<int, int>> plan;  // (state-dict tensor, index tensor)
  // State-dict tensor -> the dtype it is read in, for tensors read into staging buffers:
  // a cast (cast_floats: the stored dtype) or strided buffers (its own dtype).
  std::map<int, DType> staged_dtypes;
  std::map<int, internal_plan::ChunkLookup> lookups;  // by index tensor
  std::unique_ptr<FileCache> files;
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  // Those tensors are read (and shared between replicas) into packed staging buffers,
  // converted and scattered into the caller's buffers once every read succeeded; made as
  // a box first needs one (not zeroed: every byte is read into them before it is used).
  // A strided box read by this rank alone, without a cast, goes through one reused
  // buffer instead, scattered as soon as it is read (as other boxes are read straight
  // into the caller's memory), so its staging is one box, not the tensor.
  std::map<std::pair<int, std::size_t>, std::unique_ptr<unsigned char[]>> staged;
  std::vector<char> box_scratch;
  // Chunks needed whole that are read directly, gathered in phase 2 and read after it.
  // Only where chunks carry their own CRC32C (native, safetensors and HDF5 files distckpt
  // wrote): a single file checked by a whole-file CRC (a .ckpt) has just been read
  // through the page cache.
  internal_format::GatheredReads gathered;
  const bool gathers = options.direct_reads && internal_format::has_chunk_checksums(index);
  std::vector<int64_t> sharing{0, 0};
  local = guarded(where, [&]() -> Status {
    const std::string source = dir;
    dir = internal_format::files_dir(index, dir);
    DISTCKPT_ASSIGN_OR_RETURN(cipher, internal_format::open_index(&index, options.key.get(), source));
    DISTCKPT_RETURN_IF_ERROR(internal_format::check_unchecked(index, source, options.allow_unchecked, &result.warning));
    if (state.rank() != comm.rank())
      return invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
    DISTCKPT_ASSIGN_OR_RETURN(internal_plan::LoadNames names, internal_plan::load_names(index, options));
    const std::map<std::string, int>& stored = names.by_state_name;
    result.filtered_out = names.filtered_out;

    std::vector<int> wanted;
    if (options.only.empty()) {
      for (int i = 0; i < static_cast<int>(state.tensors().size()); ++i) wanted.push_back(i);
    } else {
      for (const auto& name : options.only) {
        const int i = state.find(name);
        if (i < 0) return invalid_argument("tensor '" + name + "' was asked for but is not in the state dict");
        wanted.push_back(i);
      }
    }
    std::set<std::string> asked;
    files = std::make_unique<FileCache>(*fs, dir, index);
    for (int i : wanted) {
      const TensorEntry& e = state.tensors()[i];
      asked.insert(e.name);
      auto it = stored.find(e.name);
      if (it == stored.end()) {
        if (options.strict)
          return mismatch("tensor '" + e.name + "' is not in checkpoint '" + dir + "'" +
                          (names.selective ? " (as the load's filters and renames see it)" : ""));
        result.missing_in_checkpoint.push_back(e.name);
        continue;
      }
      proto::Tensor& t = *index.mutable_tensors(it->second);
      if (t.dtype() != dtype_name(e.dtype)) {
        const std::optional<DType> stored_dtype = dtype_from_name(t.dtype());  // validated with the index
        const bool castable = stored_dtype && internal_transform::is_floating(*stored_dtype) &&
                              internal_transform::is_floating(e.dtype);
        if (!options.cast_floats || !castable)
          return mismatch("tensor '" + e.name + "': dtype " + std::string(dtype_name(e.dtype)) + " in the state dict, " +
                          t.dtype() + " in the checkpoint" +
                          (castable ? " (LoadOptions::cast_floats converts between floating dtypes)" : ""));
        staged_dtypes[i] = *stored_dtype;
      }
      DISTCKPT_RETURN_IF_ERROR(internal_layout::check_writable(e));
      if (e.strided()) staged_dtypes.emplace(i, e.dtype);
      const Shape stored_shape(t.global_shape().begin(), t.global_shape().end());
      if (stored_shape != e.layout.global_shape()) {
        if (!same_up_to_trailing_ones(stored_shape, e.layout.global_shape()))
          return mismatch("tensor '" + e.name + "': global shape " + shape_str(e.layout.global_shape()) +
                          " in the state dict, " + shape_str(stored_shape) + " in the checkpoint");
        DISTCKPT_RETURN_IF_ERROR(reshape_trailing_ones(t, e.layout.global_shape()));
      }
      auto lookup = lookups.emplace(it->second, internal_plan::ChunkLookup(t)).first;
      DISTCKPT_RETURN_IF_ERROR(check_sources(*files, t, lookup->second, e));
      plan.emplace_back(i, it->second);
    }
    for (const auto& [name, i] : stored)  // (a scalar that is also an info value is reported as one)
      if (!asked.count(name) && !names.info_scalars.count(name))
        result.unexpected_in_checkpoint.push_back(index.tensors(i).name());
    DISTCKPT_RETURN_IF_ERROR(internal_plan::refuse_unexpected(names, state, options, dir));
    // Whether this load reads directly, by its first box (phase 2 asks again for each
    // chunk and file): a chunk needed whole, not encrypted, of a file that reads directly.
    // If ranks answer differently, they do not share (share_words).
    bool direct = false;
    if (gathers && !plan.empty() && cipher == nullptr) {
      const auto& [i, t] = plan.front();
      const TensorEntry& e = state.tensors()[static_cast<std::size_t>(i)];
      int64_t covered = 0;
      const std::vector<internal_plan::ReadItem> reads =
          e.boxes.empty() ? std::vector<internal_plan::ReadItem>{} : lookups.at(t).plan_reads(e.boxes.front(), &covered);
      direct = reads.size() == 1 && reads.front().whole &&
               gathered.reads_directly(*files, index.tensors(t).chunks(reads.front().chunk).file_id());
    }
    const bool wants_sharing =
        comm.size() > 1 && (options.replica_reads == LoadOptions::ReplicaReads::kShared ||
                            (options.replica_reads == LoadOptions::ReplicaReads::kAuto && (comm.node_count() > 1 || direct)));
    sharing = share_words(state, index, plan, wants_sharing);
    return Status();
  });
  // One allreduce: phase 1 succeeded everywhere, and replicas may share reads. Only
  // after a failure does a second round carry the lowest failing rank's message.
  const internal_comm::Compared phase1 = internal_comm::agree_same(comm, local, sharing);
  if (phase1.failed) return agree(comm, local.with_context(where));
  const bool share = phase1.same && sharing[1] == 1;
  // A whole-file CRC-32 (a .ckpt's footer) is read whole for a single file; a per-rank
  // set's chunks are checked as they are read, like native.
  // A single file's footer is checked whole as well: it covers the structure around the
  // chunks, and a file MindSpore would refuse is damaged.
  if (!internal_format::has_chunk_checksums(index) || internal_format::is_single_file(index))
    DISTCKPT_RETURN_IF_ERROR(internal_collective::check_file_crc32(comm, *files, index, where));
  // A part of a chunk is read alone (not checked: the chunk's CRC32C covers all of it),
  // unless check_partial_chunks asks. A single file's tensor (one chunk) that no rank
  // reads whole is checked first, by one rank (a native chunk is one slice: loads onto
  // the saved layout read each whole).
  const bool check_partial = options.check_partial_chunks;
  if (!check_partial && internal_format::has_chunk_checksums(index) && internal_format::is_single_file(index))
    DISTCKPT_RETURN_IF_ERROR(internal_collective::check_unread_chunks(comm, *files, index, state, plan, where));

  const auto dtype_read = [&](int i) {
    return staged_dtypes.count(i) ? staged_dtypes.at(i) : state.tensors()[static_cast<std::size_t>(i)].dtype;
  };
  const auto buffer_read = [&](int i, std::size_t b) -> void* {
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(i)];
    auto from = staged_dtypes.find(i);
    if (from == staged_dtypes.end()) return e.buffers[b];
    std::unique_ptr<unsigned char[]>& buffer = staged[{i, b}];
    if (!buffer)
      buffer.reset(new unsigned char[std::max<std::size_t>(1, static_cast<std::size_t>(e.boxes[b].num_elements()) *
                                                                  dtype_size(from->second))]);
    return buffer.get();
  };

  // Phase 2: read what each box needs (checking the CRC32C of chunks read whole), copy it
  // into the buffers. With shared reads, each box needed by several replicas is read by
  // one of them (ReplicaGroups::assign: each member a stretch of the files in storage
  // order, the same choice on every member) and sent to the others as soon as it is read
  // and checked, while the reads go on.
  internal_base::Timer read_timer;
  internal_format::SmallRuns small;
  small.sieve = options.sieve_small_runs;
  struct BoxRead {
    int i, t;
    std::size_t b;
    std::vector<internal_plan::ReadItem> reads;
    uint64_t bytes;
    int reader;
  };
  std::vector<BoxRead> boxes;
  std::set<std::size_t> exchanged;  // boxes sent or received: read into whole buffers
  std::vector<Comm::Transfer> receives;
  Outbox outbox;
  // 2a, planning: who reads each box, and the messages. With shared reads the ranks
  // agree on it before any message is posted, so that each posts all it listed.
  local = guarded(where, [&]() -> Status {
    internal_plan::ReplicaGroups groups(comm.rank());
    struct Shared {
      uint32_t file;
      uint64_t offset;  // where the box's stored bytes start
      int box;          // in `boxes`
      int number;       // in `groups`
    };
    std::vector<Shared> shared;
    for (const auto& [i, t] : plan) {
      const TensorEntry& e = state.tensors()[i];
      const int g = share && e.layout.group_index(comm.rank()) >= 0 ? groups.group_of(e.layout) : -1;
      const bool grouped = g >= 0 && groups.members(g).size() > 1 && groups.members(g).back() < comm.size();
      for (std::size_t b = 0; b < e.boxes.size(); ++b) {
        int64_t covered = 0;  // checked in phase 1
        BoxRead box{i, t, b, lookups.at(t).plan_reads(e.boxes[b], &covered),
                    static_cast<uint64_t>(e.boxes[b].num_elements()) * dtype_size(dtype_read(i)), comm.rank()};
        if (grouped && box.bytes > 0) {
          const proto::Chunk& first = index.tensors(t).chunks(box.reads.front().chunk);
          shared.push_back(Shared{first.file_id(), first.byte_offset(), static_cast<int>(boxes.size()),
                                  groups.need(g, first.file_id(), first.byte_offset(), box.bytes)});
        }
        boxes.push_back(std::move(box));
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
      const int number = one.number;
      BoxRead& box = boxes[k];
      box.reader = groups.reader(number);
      exchanged.insert(k);
      void* buffer = buffer_read(box.i, box.b);
      if (box.reader != comm.rank()) {
        receives.push_back({box.reader, buffer, box.bytes});
        continue;
      }
      for (int member : groups.members_of(number))
        if (member != comm.rank()) {
          outbox.add(static_cast<int>(k), {member, buffer, box.bytes});
          if (comm.node_of(member) != comm.node_of(comm.rank())) result.rank_bytes_between_hosts += box.bytes;
        }
    }
    outbox.size_boxes(boxes.size());
    return Status();
  });
  if (share) DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));
  // 2b, reading. Every receive is posted first; each send when its box is read.
  std::unique_ptr<Comm::Exchange> exchange;
  if (share) {
    exchange = comm.start_exchange();
    for (const Comm::Transfer& r : receives) exchange->post_receive(r);
    outbox.start(exchange.get());
  }
  // Lets messages move every 8 pieces of 256 KiB copied (each call looks at the
  // outstanding requests).
  unsigned pieces = 0;
  const auto meanwhile = [&] {
    if (exchange && ++pieces % 8 == 0) exchange->progress();
  };
  if (local.ok()) local = guarded(where, [&]() -> Status {
    std::vector<char> scratch;
    std::vector<uint32_t> pending(boxes.size(), 0);  // per box: its chunks gathered, not read yet
    for (std::size_t k = 0; k < boxes.size(); ++k) {
      const BoxRead& box = boxes[k];
      if (box.reader != comm.rank()) continue;
      gathered.tag = static_cast<int64_t>(k);
      const std::size_t gathered_before = gathered.size();
      const TensorEntry& e = state.tensors()[static_cast<std::size_t>(box.i)];
      if (e.strided() && dtype_read(box.i) == e.dtype && !exchanged.count(k)) {
        if (box_scratch.size() < box.bytes) box_scratch.resize(box.bytes);
        DISTCKPT_RETURN_IF_ERROR(internal_format::read_into(
            *files, index, index.tensors(box.t), box.reads, e.boxes[box.b], box_scratch.data(), scratch,
            &result.rank_bytes_read, check_partial, cipher.get(), &small, nullptr));
        internal_plan::write_back(e, box.b, box_scratch.data(), e.dtype);
        result.rank_bytes_needed += box.bytes;
        outbox.ready(static_cast<int>(k));  // (nothing to send: not exchanged)
        continue;
      }
      DISTCKPT_RETURN_IF_ERROR(internal_format::read_into(
          *files, index, index.tensors(box.t), box.reads, state.tensors()[box.i].boxes[box.b], buffer_read(box.i, box.b),
          scratch, &result.rank_bytes_read, check_partial, cipher.get(), &small,
          gathers ? &gathered : nullptr));
      result.rank_bytes_needed += box.bytes;
      pending[k] = static_cast<uint32_t>(gathered.size() - gathered_before);
      if (pending[k] == 0) {  // read now, not gathered: it may go
        outbox.ready(static_cast<int>(k));
        meanwhile();
      }
    }
    DISTCKPT_RETURN_IF_ERROR(internal_format::read_gathered(
        *files, gathered, internal_format::has_chunk_checksums(index),
        [&](int64_t tag) {
          if (--pending[static_cast<std::size_t>(tag)] == 0) outbox.ready(static_cast<int>(tag));
        },
        meanwhile, &result.rank_bytes_read_direct));
    for (const auto& [i, t] : plan) result.loaded.push_back(state.tensors()[i].name);
    result.step = index.step();
    result.epoch = index.epoch();
    result.info = internal_format::info_values(index);
    return Status();
  });
  result.read_s = read_timer.seconds();
  result.rank_small_runs = small.runs;
  internal_base::Timer exchange_timer;
  if (exchange) {
    // After a failed read the rest is sent as it is, so that no peer waits for a message
    // that never comes; the agreement below then fails the load everywhere.
    outbox.post_rest();
    exchange->wait();
  }
  result.exchange_s = exchange_timer.seconds();
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));
  for (auto& [at, buffer] : staged) {
    const auto [i, b] = at;
    internal_plan::write_back(state.tensors()[static_cast<std::size_t>(i)], b, buffer.get(), staged_dtypes.at(i));
    buffer.reset();  // the peak stays one copy of the staged boxes
  }
  // Small pieces by the way they were read, so that every rank reports all of them.
  static constexpr std::string_view kSmallMethods[] = {"io_uring", "pread", "sieving"};
  std::vector<int64_t> totals{static_cast<int64_t>(result.rank_bytes_read), static_cast<int64_t>(result.rank_bytes_needed),
                              static_cast<int64_t>(result.rank_bytes_between_hosts), 0, 0, 0,
                              static_cast<int64_t>(result.rank_bytes_read_direct)};
  for (std::size_t m = 0; m < std::size(kSmallMethods); ++m)
    if (small.method == kSmallMethods[m]) totals[3 + m] = static_cast<int64_t>(small.runs);
  comm.allreduce(totals, ReduceOp::kSum);
  result.bytes_read = static_cast<uint64_t>(totals[0]);
  result.bytes_needed = static_cast<uint64_t>(totals[1]);
  result.bytes_between_hosts = static_cast<uint64_t>(totals[2]);
  result.bytes_read_direct = static_cast<uint64_t>(totals[6]);
  for (std::size_t m = 0; m < std::size(kSmallMethods); ++m)
    if (totals[3 + m] > 0) {
      result.small_runs += static_cast<uint64_t>(totals[3 + m]);
      result.small_reads += (result.small_reads.empty() ? "" : "+") + std::string(kSmallMethods[m]);
    }
  result.load_s = timer.seconds();
  return result;
}

}  // namespace distckpt
