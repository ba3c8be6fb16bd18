// The local tier's redundancy (step 3 of the tier protocol, local_save.cc): partner
// copies sent to the next node, or each parity group's segments exchanged and its parity
// written. Both are collective over the job's ranks. Internal to src/tier/.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/comm.h"
#include "distckpt/filesystem.h"
#include "distckpt/tier.h"
#include "distckpt_index.pb.h"
#include "tier/nodes.h"
#include "tier/parity.h"

namespace distckpt::internal_tier {

// Step 3, partner copies: each file's copy goes to the rank of the next node that pairs
// with its writer, in pieces, and is fsynced there. A rank whose read fails still sends
// (zeros) so that no receiver waits; its error fails the agreement that follows.
Status send_partner_copies(Comm& comm, FileSystem& fs, const proto::Index& index, const NodeMap& nodes,
                           const std::string& tmp_dir, bool fsync, uint64_t* bytes_written);

// Step 3, parity: the leaders of each group exchange segments; each computes its parity
// segments and writes parity.bin. Returns this leader's parity file CRC32C.
Result<uint32_t> write_parity(Comm& comm, FileSystem& fs, const proto::Index& index, const NodeMap& nodes,
                              const std::string& local_dir, const std::string& tmp_name, const Redundancy& red, bool fsync,
                              uint64_t* bytes_written);

}  // namespace distckpt::internal_tier
