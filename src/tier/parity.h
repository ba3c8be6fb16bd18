// Erasure codes over the nodes of a local-tier save (SCR's XOR and Reed-Solomon
// schemes, laid out so that every node stores the same share of parity).
//
// A group has G nodes. Each node's stream (the solo prefixes of its data files, in file
// order) is cut into k segments of S bytes (zero-padded). Stripe j (0 <= j < G) takes
// segment s = (i - j) mod G of group node i for the k nodes i = j .. j+k-1 (mod G), and
// stores its m parity segments on nodes j+k .. j+k+m-1 (mod G). Every node thus holds k
// data segments in k stripes and m parity segments: storage 1 + m/k of its stream, and
// a stripe loses at most m segments when any m nodes are lost. G >= k + m; leftover
// nodes of a job join the last group (they add stripes, not parity per node).
//
// xor:K is k = K-1, m = 1 with XOR parity; rs:K+M is k = K, m = M with ISA-L's
// Cauchy Reed-Solomon code (ec_encode_data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/status.h"

namespace distckpt::internal_tier {

struct Redundancy {
  enum class Kind { kNone, kAuto, kPartner, kXor, kReedSolomon };
  Kind kind = Kind::kAuto;
  int k = 0;  // data segments per stripe (parity kinds)
  int m = 0;  // parity segments per stripe
  // The nodes a parity group needs (k + m), 2 for partner kinds, 1 for none.
  int group_nodes() const;
  bool parity() const { return kind == Kind::kXor || kind == Kind::kReedSolomon; }
  std::string to_string() const;
};

// "none", "auto", "partner", "xor:K" (K >= 2), "rs:K+M" (K >= 1, M >= 1, K + M <= 32).
// kInvalidArgument naming the text otherwise.
Result<Redundancy> parse_redundancy(const std::string& text);

// The groups of `nodes` nodes (consecutive runs of group_nodes(); leftovers join the
// last group). kInvalidArgument with the counts when there are fewer nodes than one
// group needs.
Result<std::vector<std::vector<int>>> parity_groups(int nodes, const Redundancy& r);

// Where segment `segment` of group node `node` goes: its stripe.
int stripe_of(int node, int segment, int group_size);
// The group nodes of stripe `stripe`: its k data nodes, then its m parity nodes.
std::vector<int> stripe_nodes(int stripe, int group_size, const Redundancy& r);

// Computes the m parity segments of one stripe from its k data segments, `bytes` each.
// data: k pointers; parity: m pointers (written).
void encode_stripe(const Redundancy& r, const std::vector<const uint8_t*>& data, const std::vector<uint8_t*>& parity,
                   std::size_t bytes);

// Rebuilds the missing segments of one stripe. `segments`: k + m pointers (data first,
// then parity), all allocated with `bytes` bytes; present[i] says which hold their
// bytes. The missing data segments are written (parity segments are not rebuilt).
// kNotFound when more than m are missing; kInternal if the matrix does not invert.
Status decode_stripe(const Redundancy& r, const std::vector<uint8_t*>& segments, const std::vector<bool>& present,
                     std::size_t bytes);

}  // namespace distckpt::internal_tier
