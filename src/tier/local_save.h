// The local-tier save in its phases (tier.h's save_local is begin, write, finish), so
// that the asynchronous saver can stage the write and finish in the background.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "collective/save_session.h"
#include "distckpt/tier.h"
#include "tier/nodes.h"
#include "tier/parity.h"

namespace distckpt::internal_tier {

// What the local save's steps share (the frame's seam keeps it past begin_local).
struct LocalPart {
  LocalTier tier;  // dir expanded for this node
  std::string root;
  Redundancy red;
  NodeMap nodes;
  bool leader = false;  // this node's leader: makes and commits the node's directory
  std::vector<std::string> node_ids, hosts;  // per node
  proto::Index placed;  // the plan with its placement (no checksums yet), on every rank
  std::string tmp_name, tmp_dir, final_dir;
  // Rank 0: the commit number, claimed on a thread of its own while the data is
  // written (the claim is a synced write in the global root, which may be a slow
  // shared file system); the record takes it in step 4.
  std::future<Result<uint64_t>> commit_seq;
  // During finish_local: this rank's write outcome and its chunks' tags.
  const Result<std::vector<uint32_t>>* crcs = nullptr;
  const std::vector<std::string>* tags = nullptr;
  LocalSaveResult out;  // the commit's figures
};

struct LocalSession {
  internal_collective::SaveSession session;  // this rank's chunks, data file (in tmp_dir) and frame
  std::shared_ptr<LocalPart> part;
};

// Collective: step 1 of the protocol (local_save.cc) and every node's temporary
// directory. Errors: those of save_local, before anything is written.
Result<LocalSession> begin_local(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                                 const LocalTier& tier);
// Collective: steps 2 (agreement) to 5, given this rank's write outcome (its CRCs, or
// its error). After a failure no record is committed and the nodes' directories go.
Result<LocalSaveResult> finish_local(Comm& comm, LocalSession& session, const Result<std::vector<uint32_t>>& crcs);

}  // namespace distckpt::internal_tier
