// Restore's plan: which copy of each distinct chunk serves each piece, read by which
// rank (restore_plan.h).
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

std::string copy_file_path(const Attempt& a, const LocalTier& tier, const std::string& root, const Copy& c) {
  // (A drained copy never references other checkpoints' files. Global copies are read
  // through a FileCache, with its checks; this path names them in messages.)
  if (c.global) return internal_format::data_file_location(a.global, root + "/" + a.name, c.file);
  const std::string file = a.record.files(c.file).name();
  if (c.kind == kRebuilt) return tier.dir + "/" + a.name + "/rebuilt/" + file;
  return copy_path(tier.dir, a.name, file, c.kind);
}

// Step 2: for each pending piece, the copy and the rank that reads it. Returns, per
// piece, the copy used (-1: none left) and fills reader_of[copy].
std::vector<int> plan_round(const Attempt& a, const std::vector<int>& pending, const NodeMap& nodes,
                            std::map<int, int>* reader_of) {
  std::vector<uint64_t> node_load(static_cast<std::size_t>(nodes.count), 0), rank_load(nodes.node_of.size(), 0);
  std::vector<int> used(pending.size(), -1);
  std::map<std::pair<int, int>, int> chosen;  // (distinct, node) -> copy; node -1: global
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const Piece& p = a.pieces[static_cast<std::size_t>(pending[i])];
    const Distinct& d = a.distinct[static_cast<std::size_t>(p.distinct)];
    const int mine = nodes.node_of[static_cast<std::size_t>(p.rank)];
    int copy = -1;
    // 1. this node; 2. the least loaded other node; 3. the global root.
    if (auto it = chosen.find({p.distinct, mine}); it != chosen.end()) copy = it->second;
    for (int c : d.copies)
      if (copy < 0 && a.copies[static_cast<std::size_t>(c)].usable && a.copies[static_cast<std::size_t>(c)].node == mine) copy = c;
    if (copy < 0) {  // a node copy already chosen for this chunk (keys ordered: node -1 first)
      for (auto it = chosen.lower_bound({p.distinct, 0}); it != chosen.end() && it->first.first == p.distinct; ++it)
        copy = it->second;
    }
    if (copy < 0) {
      int best = -1;
      for (int c : d.copies) {
        const Copy& cp = a.copies[static_cast<std::size_t>(c)];
        if (!cp.usable || cp.node < 0) continue;
        if (best < 0 || node_load[static_cast<std::size_t>(cp.node)] <
                            node_load[static_cast<std::size_t>(a.copies[static_cast<std::size_t>(best)].node)])
          best = c;
      }
      copy = best;
    }
    if (copy < 0) {
      if (auto it = chosen.find({p.distinct, -1}); it != chosen.end()) copy = it->second;
      for (int c : d.copies)
        if (copy < 0 && a.copies[static_cast<std::size_t>(c)].usable && a.copies[static_cast<std::size_t>(c)].global) copy = c;
    }
    if (copy < 0) continue;
    used[i] = copy;
    const Copy& cp = a.copies[static_cast<std::size_t>(copy)];
    chosen[{p.distinct, cp.node}] = copy;
    if (reader_of->count(copy)) continue;
    // The reader: the needer itself when it may read the copy, else the least loaded
    // rank of the copy's node (any rank for the global root: the needer).
    int reader = p.rank;
    if (cp.node >= 0 && cp.node != mine) {
      for (int r : nodes.ranks[static_cast<std::size_t>(cp.node)])
        if (reader == p.rank || rank_load[static_cast<std::size_t>(r)] < rank_load[static_cast<std::size_t>(reader)]) reader = r;
    }
    (*reader_of)[copy] = reader;
    rank_load[static_cast<std::size_t>(reader)] += d.plain_bytes;
    if (cp.node >= 0) node_load[static_cast<std::size_t>(cp.node)] += d.plain_bytes;
  }
  return used;
}

// Adds the copies of one index (the record's local copies, or the global files) to the
// distinct chunks of the attempt.
void add_copies(Attempt& a, const proto::Index& index, bool global, const std::map<std::pair<std::string, Box>, int>& by_box,
                const std::vector<std::vector<char>>& present) {
  for (int t = 0; t < index.tensors_size(); ++t) {
    const proto::Tensor& tensor = index.tensors(t);
    for (int c = 0; c < tensor.chunks_size(); ++c) {
      const proto::Chunk& ch = tensor.chunks(c);
      auto it = by_box.find({tensor.name(), internal_format::chunk_box(ch)});
      if (it == by_box.end()) continue;
      Distinct& d = a.distinct[static_cast<std::size_t>(it->second)];
      if (global) {
        Copy copy;
        copy.distinct = it->second;
        copy.global = true;
        copy.tensor = t;
        copy.chunk = c;
        copy.file = static_cast<int>(ch.file_id());
        a.copies.push_back(copy);
        d.copies.push_back(static_cast<int>(a.copies.size()) - 1);
        continue;
      }
      const proto::TierFile& tf = index.tier().files(static_cast<int>(ch.file_id()));
      for (int k = 0; k < tf.copies_size(); ++k) {
        const proto::TierCopy& where = tf.copies(k);
        const int node = a.current_of[where.node()];
        if (node < 0 || ch.byte_offset() + ch.length() > where.bytes()) continue;
        if (!present[ch.file_id()][static_cast<std::size_t>(k)]) continue;
        Copy copy;
        copy.distinct = it->second;
        copy.tensor = t;
        copy.chunk = c;
        copy.file = static_cast<int>(ch.file_id());
        copy.kind = where.kind();
        copy.node = node;
        a.copies.push_back(copy);
        d.copies.push_back(static_cast<int>(a.copies.size()) - 1);
      }
    }
  }
  // Own node's copies first, primary before partner: plan_round takes the first usable.
  for (Distinct& d : a.distinct)
    std::stable_sort(d.copies.begin(), d.copies.end(), [&](int x, int y) {
      return a.copies[static_cast<std::size_t>(x)].kind < a.copies[static_cast<std::size_t>(y)].kind;
    });
}

}  // namespace distckpt::internal_tier
