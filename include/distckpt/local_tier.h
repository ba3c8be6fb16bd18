/// The node-local tier's settings and a local save's result: data that the asynchronous
/// checkpointer (async.h) and the tier's calls (tier.h, which includes this header)
/// share. No calls here.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/checkpoint.h"

namespace distckpt {

struct LocalTier {
  /// The node-local directory, the same path on every node; each node sees its own.
  /// Made on first use, with a random node id in <dir>/.distckpt-node. "{host}" in it is
  /// replaced by the node's host name (per-host directories on a shared disk, or several
  /// pretend nodes in one process). Two nodes that see the same directory are refused.
  std::string dir;
  /// What protects the chunks that one node alone holds (DP = 1, or replicas that share a
  /// node); chunks replicated on another node are protected by that replica at no cost:
  ///   "auto"     a copy of those chunks on the next node (nothing on a one-node job);
  ///   "partner"  a copy of each node's whole local checkpoint on the next node;
  ///   "xor:K"    XOR parity over groups of K nodes (storage 1 + 1/(K-1));
  ///   "rs:K+M"   Reed-Solomon (ISA-L) over groups of K+M nodes (storage 1 + M/K);
  ///   "none"     nothing.
  /// Fewer nodes than a group needs is kInvalidArgument, with the count.
  std::string redundancy = "auto";
  /// Keep the files of the local checkpoint removed last (remove_local, the manager's
  /// retention) in <dir>/.distckpt-spare, and write the next local save into them: overwriting
  /// pages a file already has is faster than making new ones (a tmpfs allocates each).
  /// The node's peak use is unchanged (a save turns the spares into its own files as it
  /// writes); between saves it holds one checkpoint's files more. The manager's end()
  /// gives them back. On tmpfs each rank writes its spare through a mapping the process kept
  /// from the last time it wrote that file (a memcpy; docs/guide/tiers.md "Surviving node loss"): at most 8
  /// per process, pinning nothing while their files have names.
  bool recycle = true;
};

struct LocalSaveResult {
  SaveResult save;                ///< path: the record's name in the global root
  uint64_t redundancy_bytes = 0;  ///< partner copies and parity written, all nodes
  uint64_t node_bytes_max = 0;    ///< the most bytes one node stored (data + redundancy)
  uint64_t node_state_max = 0;    ///< the most state one node's ranks hold (distinct chunks)
  double storage_ratio = 0;       ///< max over nodes: bytes stored / state held (1.0: no extra)
  double redundancy_s = 0;        ///< of write_s: making the copies or the parity
};

}  // namespace distckpt
