// The local tier's redundancy: partner copies and parity (redundancy.h).
#include "tier/redundancy.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <system_error>

#include "base/guard.h"
#include "base/kill_point.h"
#include "base/timer.h"
#include "catalog/claims.h"
#include "catalog/names.h"
#include "collective/save_session.h"
#include "collective/save_strategies.h"
#include "comm/agree.h"
#include "distckpt/tier.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "storage/spare_files.h"
#include "storage/write_maps.h"
#include "tier/nodes.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "tier/streams.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt::internal_tier {

using internal_base::guarded;
using internal_comm::agree;

// Step 3, partner copies: each file's copy goes to the rank of the next node that pairs
// with its writer, in pieces, and is fsynced there. A rank whose read fails still sends
// (zeros) so that no receiver waits; its error fails the agreement that follows.
Status send_partner_copies(Comm& comm, FileSystem& fs, const proto::Index& index, const NodeMap& nodes,
                           const std::string& tmp_dir, bool fsync, uint64_t* bytes_written) {
  constexpr uint64_t kPiece = uint64_t{64} << 20;
  struct Job {
    int from, to;
    int file;
    uint64_t bytes;
  };
  std::vector<Job> jobs;
  uint64_t rounds = 0;
  const proto::TierPlacement& p = index.tier();
  for (int f = 0; f < p.files_size(); ++f)
    for (const proto::TierCopy& c : p.files(f).copies())
      if (c.kind() == kPartner) {
        const int from = p.files(f).writer_rank();
        jobs.push_back(Job{from, nodes.peer_on(static_cast<int>(c.node()), from), f, c.bytes()});
        rounds = std::max(rounds, (c.bytes() + kPiece - 1) / kPiece);
      }
  const int me = comm.rank();
  Status status;
  std::map<int, std::unique_ptr<ReadableFile>> sources;
  std::map<int, std::unique_ptr<WritableFile>> copies;
  for (const Job& j : jobs) {
    const std::string name = index.files(j.file).name();
    if (j.from == me && status.ok()) {
      auto file = fs.open_readable(tmp_dir + "/" + name);
      if (file.ok()) sources[j.file] = std::move(file).value();
      else status = file.status();
    }
    if (j.to == me && status.ok()) {
      auto file = fs.open_writable(tmp_dir + "/partner/" + name);
      if (file.ok()) copies[j.file] = std::move(file).value();
      else status = file.status();
    }
  }
  // One buffer per job of this rank, sized for a piece, made before any exchange: an
  // allocation failing on one rank fails the agreement instead of leaving its peers
  // waiting in Comm::transfer.
  std::vector<std::vector<char>> buffers(jobs.size());
  Status allocated = guarded("partner copies: buffers", [&]() -> Status {
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].from == me || jobs[i].to == me)
        buffers[i].resize(static_cast<std::size_t>(std::min(kPiece, jobs[i].bytes)));
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, allocated));
  for (uint64_t round = 0; round < rounds; ++round) {
    std::vector<Comm::Transfer> sends, receives;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      const uint64_t at = round * kPiece;
      if (at >= j.bytes || (j.from != me && j.to != me)) continue;
      const std::size_t n = static_cast<std::size_t>(std::min(kPiece, j.bytes - at));
      if (j.from == me) {
        if (status.ok()) status = sources[j.file]->read_at(buffers[i].data(), n, at);
        sends.push_back({j.to, buffers[i].data(), n});
      }
      if (j.to == me) receives.push_back({j.from, buffers[i].data(), n});
    }
    comm.transfer(sends, receives);  // every rank, each round (in-process comms need it)
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      const uint64_t at = round * kPiece;
      if (j.to != me || at >= j.bytes || !status.ok()) continue;
      const std::size_t n = static_cast<std::size_t>(std::min(kPiece, j.bytes - at));
      status = copies[j.file]->write_at(buffers[i].data(), n, at);
      *bytes_written += n;
    }
  }
  for (auto& [f, file] : copies) {
    if (status.ok() && fsync) status = file->sync();
    if (status.ok()) status = file->close();
  }
  return status;
}

// Step 3, parity: the leaders of each group exchange segments; each computes its parity
// segments and writes parity.bin. Returns this leader's parity file CRC32C.
Result<uint32_t> write_parity(Comm& comm, FileSystem& fs, const proto::Index& index, const NodeMap& nodes,
                              const std::string& local_dir, const std::string& tmp_name, const Redundancy& red, bool fsync,
                              uint64_t* bytes_written) {
  const int me = comm.rank();
  const int my_node = nodes.node_of[static_cast<std::size_t>(me)];
  const bool leader = nodes.leader(my_node) == me;
  Status status;
  uint32_t crc = 0;
  for (const proto::TierParityGroup& g : index.tier().groups()) {
    const int G = g.nodes_size();
    const uint64_t S = g.segment_bytes();
    int pos = -1;
    for (int i = 0; i < G; ++i)
      if (static_cast<int>(g.nodes(i)) == my_node) pos = i;
    // Ranks outside the group, and non-leaders, only take part in the exchange (every
    // rank calls Comm::transfer alike).
    const bool part = pos >= 0 && leader;
    // Every buffer before the exchange, agreed: an allocation failing on one rank must
    // not leave its peers waiting in Comm::transfer.
    std::vector<uint8_t> stream, parity;
    std::vector<std::vector<uint8_t>> received(static_cast<std::size_t>(red.m * red.k)), encoded;
    Status allocated = guarded("parity: buffers", [&]() -> Status {
      if (!part) return Status();
      stream.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(red.k), 0);
      parity.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(red.m), 0);
      for (auto& buf : received) buf.resize(static_cast<std::size_t>(S));
      encoded.assign(static_cast<std::size_t>(red.m), std::vector<uint8_t>(static_cast<std::size_t>(S)));
      return Status();
    });
    DISTCKPT_RETURN_IF_ERROR(agree(comm, allocated));
    if (part && S > 0 && status.ok())
      status = read_stream(fs, index, my_node, local_dir, tmp_name, stream.data(), stream.size());
    // My parity stripes: j with (pos - j) mod G == k + q.
    std::vector<Comm::Transfer> sends, receives;
    for (int j = 0; j < G && S > 0 && part; ++j) {
      const std::vector<int> members = stripe_nodes(j, G, red);
      for (int d = 0; d < red.k; ++d)
        for (int q = 0; q < red.m; ++q) {
          const int from = nodes.leader(static_cast<int>(g.nodes(members[static_cast<std::size_t>(d)])));
          const int to = nodes.leader(static_cast<int>(g.nodes(members[static_cast<std::size_t>(red.k + q)])));
          if (members[static_cast<std::size_t>(d)] == pos)
            sends.push_back({to, stream.data() + static_cast<std::size_t>(d) * S, static_cast<std::size_t>(S)});
          if (members[static_cast<std::size_t>(red.k + q)] == pos) {
            auto& buf = received[static_cast<std::size_t>(q * red.k + d)];
            receives.push_back({from, buf.data(), static_cast<std::size_t>(S)});
          }
        }
    }
    comm.transfer(sends, receives);
    if (!part) continue;
    for (int q = 0; q < red.m && S > 0; ++q) {
      std::vector<const uint8_t*> data;
      for (int d = 0; d < red.k; ++d) data.push_back(received[static_cast<std::size_t>(q * red.k + d)].data());
      std::vector<uint8_t*> out;
      for (auto& a : encoded) out.push_back(a.data());
      encode_stripe(red, data, out, static_cast<std::size_t>(S));
      std::memcpy(parity.data() + static_cast<std::size_t>(q) * S, encoded[static_cast<std::size_t>(q)].data(), static_cast<std::size_t>(S));
    }
    if (status.ok()) {
      status = guarded("parity", [&]() -> Status {
        DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(local_dir + "/" + tmp_name + "/" + kParityFile));
        if (!parity.empty()) DISTCKPT_RETURN_IF_ERROR(file->write_at(parity.data(), parity.size(), 0));
        if (fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
        return file->close();
      });
      crc = internal_transform::crc32c_finish(
          internal_transform::crc32c_extend(internal_transform::kCrc32cInit, parity.data(), parity.size()));
      *bytes_written += parity.size();
    }
  }
  if (!status.ok()) return status;
  return crc;
}

}  // namespace distckpt::internal_tier
