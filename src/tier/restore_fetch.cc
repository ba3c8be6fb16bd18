// Restore's fetching: a round's reads, checks and transfers, and the parity rebuild of
// lost nodes (restore_plan.h).
#include "tier/restore_plan.h"

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
#include "collective/exchange.h"
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
#include "transform/float_cast.h"

namespace distckpt::internal_tier {

using internal_base::guarded;
using internal_comm::agree;

namespace {

// Counts a piece this rank needs by where its copy came from.
void count_piece(const Copy& c, const Piece& p, int my_node, Counters* counters) {
  const int source = c.global ? kGlobal : c.kind == kRebuilt ? kParity : c.node == my_node ? kLocal : kPeer;
  uint64_t* counter[] = {&counters->sources.local, &counters->sources.peer, &counters->sources.parity,
                         &counters->sources.global};
  *counter[source] += p.bytes;
  counters->needed += p.bytes;
}

}  // namespace

// One round: reads, agreement on failed copies, transfers. Returns the pieces still
// pending.
std::vector<int> run_round(Comm& comm, StateDict& state, Attempt& a, const LocalTier& tier, const std::string& root,
                           FileSystem& fs, const std::vector<int>& pending, const NodeMap& nodes, Counters* counters,
                           Status* fatal) {
  std::map<int, int> reader_of;
  const std::vector<int> used = plan_round(a, pending, nodes, &reader_of);
  const int me = comm.rank();
  // This rank's pieces per copy it reads, or receives.
  std::map<int, std::vector<std::size_t>> pieces_of;  // copy -> indices into `pending`
  for (std::size_t i = 0; i < pending.size(); ++i)
    if (used[i] >= 0) pieces_of[used[i]].push_back(i);
  // Whether piece `i` fills its rank's whole box with a whole chunk (most layouts):
  // then bytes move straight between files, messages and the state's buffers.
  auto whole = [&](std::size_t i) {
    const Piece& p = a.pieces[static_cast<std::size_t>(pending[i])];
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(p.state_tensor)];
    return p.region == a.distinct[static_cast<std::size_t>(p.distinct)].box &&
           (p.rank != me || p.region == e.boxes[static_cast<std::size_t>(p.box)]);
  };
  // Reads: each copy this rank reads, whole, checked; into the state's buffer when one
  // of its own pieces is the whole chunk (a copy that fails is re-read from another
  // copy into that buffer, so no unchecked byte stays there once the restore succeeds).
  struct Held {
    char* bytes = nullptr;
    std::unique_ptr<char[]> owned;  // uninitialized: every byte is read
  };
  std::map<int, Held> data;
  std::vector<int64_t> failed(a.copies.size(), 0);
  std::vector<char> scratch;
  // The global copy's files as a load opens them: sizes checked against its index, its
  // subdirectories real ones, a referenced checkpoint the one referenced.
  internal_format::FileCache global_files(fs, root + "/" + a.name, a.global);
  for (const auto& [copy, reader] : reader_of) {
    if (reader != me) continue;
    const Copy& c = a.copies[static_cast<std::size_t>(copy)];
    const proto::Index& index = c.global ? a.global : a.record;
    const proto::Tensor& t = index.tensors(c.tensor);
    const std::string path = copy_file_path(a, tier, root, c);
    Held& held = data[copy];
    for (std::size_t i : pieces_of[copy]) {
      const Piece& p = a.pieces[static_cast<std::size_t>(pending[i])];
      if (p.rank == me && whole(i))
        held.bytes = static_cast<char*>(state.tensors()[static_cast<std::size_t>(p.state_tensor)].buffers[static_cast<std::size_t>(p.box)]);
    }
    if (held.bytes == nullptr) {
      // Out of memory is this restore's failure (agreed below), not a lost copy.
      Status made = guarded("restore: rank " + std::to_string(me), [&]() -> Status {
        held.owned.reset(new char[static_cast<std::size_t>(a.distinct[static_cast<std::size_t>(c.distinct)].plain_bytes)]);
        return Status();
      });
      if (!made.ok()) {
        if (fatal->ok()) *fatal = made;
        break;
      }
      held.bytes = held.owned.get();
    }
    Status st = guarded("restore: rank " + std::to_string(me), [&]() -> Status {
      internal_format::ChunkCheck check;
      check.crc = internal_format::has_chunk_checksums(index);
      check.cipher = c.global ? a.global_cipher.get() : a.record_cipher.get();
      check.file_identity = index.files(c.file).name();
      check.where = "'" + path + "'";
      if (c.global) {
        DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, global_files.get(static_cast<uint32_t>(c.file)));
        return internal_format::read_chunk(*file, t, c.chunk, held.bytes, check, scratch);
      }
      DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(path));
      return internal_format::read_chunk(*file, t, c.chunk, held.bytes, check, scratch);
    });
    counters->sources.storage_read += t.chunks(c.chunk).length();
    if (!st.ok()) {
      failed[static_cast<std::size_t>(copy)] = 1;
      std::fprintf(stderr, "distckpt: restore: rank %d: %s: counted as lost\n", me, st.to_string().c_str());
      // A local copy that fails its check is lost, not data; a global one is an error.
      if (c.global && fatal->ok()) *fatal = st;
    }
  }
  comm.allreduce(failed, ReduceOp::kMax);
  Status agreed = agree(comm, *fatal);
  if (!agreed.ok()) {
    *fatal = agreed;
    return {};
  }
  for (std::size_t c = 0; c < failed.size(); ++c)
    if (failed[c]) a.copies[c].usable = false;
  std::vector<int> still;  // transfers (collective/exchange.h) of the pieces whose copy was read
  internal_collective::ReadExchange exchange;  // items: copies
  std::vector<std::unique_ptr<char[]>> packed;
  struct Landing {
    char* bytes;
    int piece;
  };
  std::vector<Landing> landings;
  // Inside guarded and agreed before the exchange: a staging buffer that cannot be made
  // on one rank must not leave its peers waiting in Comm::transfer.
  Status staged = guarded("restore: rank " + std::to_string(me), [&]() -> Status {
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const int copy = used[i];
      if (copy < 0 || failed[static_cast<std::size_t>(copy)]) {
        still.push_back(pending[i]);
        continue;
      }
      const Piece& p = a.pieces[static_cast<std::size_t>(pending[i])];
      const Copy& c = a.copies[static_cast<std::size_t>(copy)];
      const int reader = reader_of.at(copy);
      const TensorEntry& e = state.tensors()[static_cast<std::size_t>(p.state_tensor)];
      const std::size_t item = dtype_size(e.dtype);
      const Box chunk_box = a.distinct[static_cast<std::size_t>(p.distinct)].box;
      void* box_buffer = p.rank == me ? e.buffers[static_cast<std::size_t>(p.box)] : nullptr;
      if (p.rank == me) count_piece(c, p, nodes.node_of[static_cast<std::size_t>(me)], counters);
      if (reader == me && p.rank == me) {
        char* from = data.at(copy).bytes;
        if (from != box_buffer)
          copy_box(from, chunk_box, box_buffer, e.boxes[static_cast<std::size_t>(p.box)], p.region, item);
      } else if (reader == me) {
        char* from = data.at(copy).bytes;
        if (!(p.region == chunk_box)) {  // a part of the chunk: packed row-major
          packed.emplace_back(new char[static_cast<std::size_t>(p.bytes)]);
          copy_box(from, chunk_box, packed.back().get(), p.region, p.region, item);
          from = packed.back().get();
        }
        exchange.add_send(copy, {p.rank, from, static_cast<std::size_t>(p.bytes)});
      } else if (p.rank == me) {
        if (whole(i)) {
          exchange.add_receive({reader, box_buffer, static_cast<std::size_t>(p.bytes)});
        } else {
          packed.emplace_back(new char[static_cast<std::size_t>(p.bytes)]);
          exchange.add_receive({reader, packed.back().get(), static_cast<std::size_t>(p.bytes)});
          landings.push_back({packed.back().get(), pending[i]});
        }
      }
    }
    return Status();
  });
  if (Status st = agree(comm, staged); !st.ok()) {
    *fatal = st;
    return {};
  }
  // Every copy the round read was checked and agreed on: its sends go, every rank alike.
  exchange.start(comm, a.copies.size());
  for (const auto& [copy, reader] : reader_of)
    if (reader == me && !failed[static_cast<std::size_t>(copy)]) exchange.ready(copy);
  exchange.finish();
  for (const Landing& l : landings) {
    const Piece& p = a.pieces[static_cast<std::size_t>(l.piece)];
    const TensorEntry& e = state.tensors()[static_cast<std::size_t>(p.state_tensor)];
    copy_box(l.bytes, p.region, e.buffers[static_cast<std::size_t>(p.box)], e.boxes[static_cast<std::size_t>(p.box)],
             p.region, dtype_size(e.dtype));
  }
  return still;
}

// Step 4: rebuilds the streams of lost nodes from parity onto a surviving node of each
// group, as files <dir>/<name>/rebuilt/<file>, and adds them as copies. Collective.
Status rebuild(Comm& comm, FileSystem& fs, Attempt& a, const LocalTier& tier, const NodeMap& nodes, const Redundancy& red,
               const std::set<int>& lost_record_nodes, Counters* counters) {
  const int me = comm.rank();
  const std::string where = "restore: rank " + std::to_string(me) + ": parity rebuild";
  Status local;
  std::vector<std::pair<int, int>> rebuilt_files;  // (file, current node)
  for (const proto::TierParityGroup& g : a.record.tier().groups()) {
    const int G = g.nodes_size();
    const uint64_t S = g.segment_bytes();
    std::vector<bool> lost(static_cast<std::size_t>(G));
    int rebuilder_pos = -1, lost_count = 0;
    for (int i = 0; i < G; ++i) {
      const int rn = static_cast<int>(g.nodes(i));
      lost[static_cast<std::size_t>(i)] = lost_record_nodes.count(rn) > 0 || a.current_of[static_cast<std::size_t>(rn)] < 0;
      if (lost[static_cast<std::size_t>(i)]) ++lost_count;
      else if (rebuilder_pos < 0) rebuilder_pos = i;
    }
    bool needed = false;
    for (int i = 0; i < G; ++i)
      if (lost[static_cast<std::size_t>(i)] && !stream_files(a.record, static_cast<int>(g.nodes(i))).empty()) needed = true;
    if (!needed || rebuilder_pos < 0 || S == 0) continue;
    const int rebuilder =
        nodes.leader(a.current_of[static_cast<std::size_t>(g.nodes(rebuilder_pos))]);
    const auto leader_of = [&](int pos) { return nodes.leader(a.current_of[static_cast<std::size_t>(g.nodes(pos))]); };
    // Surviving leaders read their stream and parity (checked against the record).
    std::vector<uint8_t> stream, parity;
    int my_pos = -1;
    for (int i = 0; i < G; ++i)
      if (!lost[static_cast<std::size_t>(i)] && leader_of(i) == me) my_pos = i;
    if (my_pos >= 0) {
      // Inside guarded: an allocation that fails on one rank must not skip the agreement.
      Status st = guarded(where, [&]() -> Status {
        stream.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(red.k), 0);
        parity.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(red.m), 0);
        return read_stream(fs, a.record, static_cast<int>(g.nodes(my_pos)), tier.dir, a.name, stream.data(), stream.size());
      });
      if (st.ok())
        st = guarded(where, [&]() -> Status {
          DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(tier.dir + "/" + a.name + "/" + kParityFile));
          DISTCKPT_RETURN_IF_ERROR(file->read_at(parity.data(), parity.size(), 0));
          const uint32_t crc = internal_transform::crc32c_finish(
              internal_transform::crc32c_extend(internal_transform::kCrc32cInit, parity.data(), parity.size()));
          if (crc != g.parity_crc32c(my_pos)) return corruption("parity of this node does not match its CRC32C");
          return Status();
        });
      counters->sources.parity_read += stream.size() + parity.size();
      if (!st.ok()) local = st.with_context(where);
    }
    // A damaged surviving stream or parity would poison the rebuild: agree first.
    DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
    // Every stripe with a lost data segment: the rebuilder collects the others.
    std::map<int, std::vector<std::vector<uint8_t>>> stripes;  // stripe -> k + m segments (rebuilder)
    std::vector<Comm::Transfer> sends, receives;
    local = guarded(where, [&]() -> Status {
      for (int j = 0; j < G; ++j) {
        const std::vector<int> members = stripe_nodes(j, G, red);
        bool wants = false;
        for (int d = 0; d < red.k; ++d)
          if (lost[static_cast<std::size_t>(members[static_cast<std::size_t>(d)])]) wants = true;
        if (!wants) continue;
        if (me == rebuilder) stripes[j].assign(static_cast<std::size_t>(red.k + red.m), std::vector<uint8_t>(static_cast<std::size_t>(S), 0));
        for (int s = 0; s < red.k + red.m; ++s) {
          const int pos = members[static_cast<std::size_t>(s)];
          if (lost[static_cast<std::size_t>(pos)]) continue;
          uint8_t* src = s < red.k ? stream.data() + static_cast<std::size_t>(s) * S
                                   : parity.data() + static_cast<std::size_t>(s - red.k) * S;
          if (pos == my_pos && me == rebuilder) {
            std::memcpy(stripes[j][static_cast<std::size_t>(s)].data(), src, static_cast<std::size_t>(S));
          } else if (pos == my_pos) {
            sends.push_back({rebuilder, src, static_cast<std::size_t>(S)});
          } else if (me == rebuilder) {
            receives.push_back({leader_of(pos), stripes[j][static_cast<std::size_t>(s)].data(), static_cast<std::size_t>(S)});
          }
        }
      }
      return Status();
    });
    DISTCKPT_RETURN_IF_ERROR(agree(comm, local));  // the rebuilder's buffers exist
    comm.transfer(sends, receives);  // every rank alike
    if (me == rebuilder) {
      local = guarded(where, [&]() -> Status {
        std::map<int, std::vector<uint8_t>> streams;  // lost position -> stream
        for (auto& [j, segs] : stripes) {
          const std::vector<int> members = stripe_nodes(j, G, red);
          std::vector<uint8_t*> ptrs;
          std::vector<bool> present;
          for (int s = 0; s < red.k + red.m; ++s) {
            ptrs.push_back(segs[static_cast<std::size_t>(s)].data());
            present.push_back(!lost[static_cast<std::size_t>(members[static_cast<std::size_t>(s)])]);
          }
          DISTCKPT_RETURN_IF_ERROR(decode_stripe(red, ptrs, present, static_cast<std::size_t>(S)));
          for (int s = 0; s < red.k; ++s) {
            const int pos = members[static_cast<std::size_t>(s)];
            if (!lost[static_cast<std::size_t>(pos)]) continue;
            auto& out = streams[pos];
            out.resize(static_cast<std::size_t>(S) * static_cast<std::size_t>(red.k));
            std::memcpy(out.data() + static_cast<std::size_t>(s) * S, segs[static_cast<std::size_t>(s)].data(), static_cast<std::size_t>(S));
          }
        }
        DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(tier.dir + "/" + a.name + "/rebuilt"));
        for (auto& [pos, bytes] : streams) {
          std::size_t at = 0;
          for (int f : stream_files(a.record, static_cast<int>(g.nodes(pos)))) {
            const uint64_t n = a.record.tier().files(f).solo_bytes();
            if (n > bytes.size() - at) return internal_error("a rebuilt stream is shorter than its files");
            DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(tier.dir + "/" + a.name + "/rebuilt/" + a.record.files(f).name()));
            DISTCKPT_RETURN_IF_ERROR(file->write_at(bytes.data() + at, static_cast<std::size_t>(n), 0));
            DISTCKPT_RETURN_IF_ERROR(file->close());
            at += static_cast<std::size_t>(n);
          }
        }
        return Status();
      });
    }
    DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
    // The rebuilt files are copies on the rebuilder's node (their chunks are checked as
    // they are read, like any copy).
    const int rebuilder_node = nodes.node_of[static_cast<std::size_t>(rebuilder)];
    for (int i = 0; i < G; ++i)
      if (lost[static_cast<std::size_t>(i)])
        for (int f : stream_files(a.record, static_cast<int>(g.nodes(i)))) rebuilt_files.push_back({f, rebuilder_node});
  }
  // Add copies for every chunk within the rebuilt prefixes.
  for (const auto& [f, node] : rebuilt_files) {
    const uint64_t solo = a.record.tier().files(f).solo_bytes();
    for (std::size_t d = 0; d < a.distinct.size(); ++d) {
      const Distinct& dist = a.distinct[d];
      const proto::Tensor& t = a.record.tensors(dist.record_tensor);
      for (int c = 0; c < t.chunks_size(); ++c) {
        const proto::Chunk& ch = t.chunks(c);
        if (static_cast<int>(ch.file_id()) != f || ch.byte_offset() + ch.length() > solo) continue;
        if (!(internal_format::chunk_box(ch) == dist.box)) continue;
        Copy copy;
        copy.distinct = static_cast<int>(d);
        copy.tensor = dist.record_tensor;
        copy.chunk = c;
        copy.file = f;
        copy.kind = kRebuilt;
        copy.node = node;
        a.copies.push_back(copy);
        a.distinct[d].copies.push_back(static_cast<int>(a.copies.size()) - 1);
      }
    }
  }
  return Status();
}

}  // namespace distckpt::internal_tier
