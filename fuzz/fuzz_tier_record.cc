// A local-tier record (<root>/.distckpt/tier/<name>): the index's frame and checks, then
// the placement (nodes, copies, parity groups) that a restore plans its reads and
// rebuilds from. An input without the frame's magic is framed with a correct checksum,
// as in fuzz_index, so that mutations reach validate_placement. What it accepts must be
// safe to rebuild from: each node's stream (its files' solo bytes end to end) is at most
// 2^62 bytes, and a parity group's segments hold its longest stream without wrapping.
#include "fuzz_util.h"
#include "tier/parity.h"
#include "tier/record.h"
#include "tier/streams.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  using u128 = unsigned __int128;  // sums that cannot wrap
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.rfind("DCKPTIDX", 0) != 0) bytes = internal_format::frame_payload(bytes);
  auto record = internal_format::parse_index(bytes, "fuzz/record");
  if (!record.ok() || !internal_tier::validate_placement(*record, "fuzz/record").ok()) return 0;
  fuzz::check_accepted(*record);  // the index part, as every reader's result
  const proto::TierPlacement& p = record->tier();
  std::vector<u128> exact(static_cast<std::size_t>(p.nodes_size()), 0);
  for (int n = 0; n < p.nodes_size(); ++n)
    for (int f : internal_tier::stream_files(*record, n)) {
      if (f < 0 || f >= p.files_size()) std::abort();
      exact[static_cast<std::size_t>(n)] += p.files(f).solo_bytes();
    }
  const std::vector<uint64_t> streams = internal_tier::stream_lengths(*record);
  for (std::size_t n = 0; n < exact.size(); ++n)
    if (exact[n] > (u128{1} << 62) || streams[n] != exact[n]) std::abort();
  auto red = internal_tier::parse_redundancy(p.redundancy());
  if (!red.ok()) std::abort();  // validate_placement parsed it
  for (const auto& g : p.groups()) {
    for (uint32_t n : g.nodes()) {
      if (n >= static_cast<uint32_t>(p.nodes_size())) std::abort();
      if (static_cast<u128>(g.segment_bytes()) * static_cast<unsigned>(red->k) < exact[n]) std::abort();
    }
  }
  return 0;
}
