// Restore's plan (restore.cc): the copies of every distinct chunk a restore attempt
// can read, the pieces the ranks need, and each round's choice of copy and reader;
// and its fetching (restore_fetch.cc): a round's reads, checks and transfers, and the
// parity rebuild of lost nodes. Every rank computes the same plan from the same
// inputs. Internal to src/tier/.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "distckpt/comm.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "distckpt/tier.h"
#include "distckpt_index.pb.h"
#include "tier/nodes.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "transform/cipher.h"

namespace distckpt::internal_tier {

constexpr uint32_t kRebuilt = 2;  // a copy rebuilt from parity, <dir>/<name>/rebuilt/<file>
enum Source { kLocal = 0, kPeer = 1, kParity = 2, kGlobal = 3 };

struct Copy {
  int distinct = 0;
  bool global = false;
  int tensor = 0, chunk = 0;  // in the record, or in the global index
  int file = 0;
  uint32_t kind = kPrimary;
  int node = -1;  // current node holding it; -1 for the global root (any node reads it)
  bool usable = true;
};

struct Distinct {
  int record_tensor = 0;
  Box box;
  uint64_t plain_bytes = 0;
  std::vector<int> copies;
};

struct Piece {
  int state_tensor = 0;
  int rank = 0;
  int box = 0;
  int distinct = 0;
  Box region;
  uint64_t bytes = 0;
};

// What one restore attempt works from, the same on every rank.
struct Attempt {
  std::string name;
  proto::Index record;  // opened (tensors decrypted)
  bool has_record = false;
  proto::Index global;  // the drained copy's index, opened
  bool has_global = false;
  std::shared_ptr<const internal_transform::CheckpointCipher> record_cipher, global_cipher;
  std::vector<int> current_of;  // record node -> current node, -1 when gone
  std::vector<Copy> copies;
  std::vector<Distinct> distinct;
  std::vector<Piece> pieces;
};

struct Counters {
  RestoreSources sources;
  uint64_t needed = 0;
};

// The file of copy `c` (a node's local copy, a rebuilt one, or the global root's).
std::string copy_file_path(const Attempt& a, const LocalTier& tier, const std::string& root, const Copy& c);

// Step 2: for each pending piece, the copy and the rank that reads it. Returns, per
// piece, the copy used (-1: none left) and fills reader_of[copy].
std::vector<int> plan_round(const Attempt& a, const std::vector<int>& pending, const NodeMap& nodes,
                            std::map<int, int>* reader_of);

// Adds the copies of one index (the record's local copies, or the global files) to the
// distinct chunks of the attempt.
void add_copies(Attempt& a, const proto::Index& index, bool global, const std::map<std::pair<std::string, Box>, int>& by_box,
                const std::vector<std::vector<char>>& present);

// One round: reads, agreement on failed copies, transfers. Returns the pieces still
// pending.
std::vector<int> run_round(Comm& comm, StateDict& state, Attempt& a, const LocalTier& tier, const std::string& root,
                           FileSystem& fs, const std::vector<int>& pending, const NodeMap& nodes, Counters* counters,
                           Status* fatal);

// Step 4: rebuilds the streams of lost nodes from parity onto a surviving node of each
// group, as files <dir>/<name>/rebuilt/<file>, and adds them as copies. Collective.
Status rebuild(Comm& comm, FileSystem& fs, Attempt& a, const LocalTier& tier, const NodeMap& nodes, const Redundancy& red,
               const std::set<int>& lost_record_nodes, Counters* counters);

}  // namespace distckpt::internal_tier
