#include "tier/parity.h"

#include <cstring>

#include <isa-l/erasure_code.h>

#include "base/text.h"

namespace distckpt::internal_tier {

int Redundancy::group_nodes() const {
  switch (kind) {
    case Kind::kNone: return 1;
    case Kind::kAuto:
    case Kind::kPartner: return 2;
    default: return k + m;
  }
}

std::string Redundancy::to_string() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kAuto: return "auto";
    case Kind::kPartner: return "partner";
    case Kind::kXor: return "xor:" + std::to_string(k + 1);
    case Kind::kReedSolomon: return "rs:" + std::to_string(k) + "+" + std::to_string(m);
  }
  return "?";
}

namespace {

// A decimal in [lo, hi], the whole of `text`.
bool parse_int(const std::string& text, int lo, int hi, int* out) {
  if (text.empty() || text.size() > 3) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  *out = std::stoi(text);
  return *out >= lo && *out <= hi;
}

}  // namespace

Result<Redundancy> parse_redundancy(const std::string& text) {
  Redundancy r;
  const auto bad = [&](const std::string& why) {
    // The text may come from a record on disk: escaped, and cut short.
    const std::string shown = internal_base::printable(text.substr(0, 64)) + (text.size() > 64 ? "..." : "");
    return invalid_argument("redundancy '" + shown + "': " + why +
                            " (expected none, auto, partner, xor:K with K >= 2, or rs:K+M)");
  };
  if (text == "none") r.kind = Redundancy::Kind::kNone;
  else if (text == "auto") r.kind = Redundancy::Kind::kAuto;
  else if (text == "partner") r.kind = Redundancy::Kind::kPartner;
  else if (text.rfind("xor:", 0) == 0) {
    int nodes = 0;
    if (!parse_int(text.substr(4), 2, 32, &nodes)) return bad("K must be 2 to 32");
    r.kind = Redundancy::Kind::kXor;
    r.k = nodes - 1;
    r.m = 1;
  } else if (text.rfind("rs:", 0) == 0) {
    const std::string rest = text.substr(3);
    const auto plus = rest.find('+');
    if (plus == std::string::npos) return bad("no '+'");
    if (!parse_int(rest.substr(0, plus), 1, 31, &r.k) || !parse_int(rest.substr(plus + 1), 1, 31, &r.m) ||
        r.k + r.m > 32)
      return bad("K >= 1, M >= 1 and K + M <= 32");
    r.kind = Redundancy::Kind::kReedSolomon;
  } else {
    return bad("unknown kind");
  }
  return r;
}

Result<std::vector<std::vector<int>>> parity_groups(int nodes, const Redundancy& r) {
  const int size = r.group_nodes();
  if (nodes < size)
    return invalid_argument("redundancy " + r.to_string() + " needs at least " + std::to_string(size) +
                            " nodes; the job runs on " + std::to_string(nodes));
  std::vector<std::vector<int>> groups;
  for (int n = 0; n < nodes; ++n) {
    if (n % size == 0 && nodes - n >= size) groups.emplace_back();
    groups.back().push_back(n);
  }
  return groups;
}

int stripe_of(int node, int segment, int group_size) { return ((node - segment) % group_size + group_size) % group_size; }

std::vector<int> stripe_nodes(int stripe, int group_size, const Redundancy& r) {
  std::vector<int> nodes;
  for (int i = 0; i < r.k + r.m; ++i) nodes.push_back((stripe + i) % group_size);
  return nodes;
}

namespace {

// The (k + m) x k Cauchy matrix of the code: identity on top, parity rows below.
std::vector<unsigned char> rs_matrix(const Redundancy& r) {
  std::vector<unsigned char> a(static_cast<std::size_t>((r.k + r.m) * r.k));
  gf_gen_cauchy1_matrix(a.data(), r.k + r.m, r.k);
  return a;
}

void xor_into(uint8_t* dst, const uint8_t* src, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) dst[i] ^= src[i];
}

}  // namespace

void encode_stripe(const Redundancy& r, const std::vector<const uint8_t*>& data, const std::vector<uint8_t*>& parity,
                   std::size_t bytes) {
  if (r.kind == Redundancy::Kind::kXor) {
    std::memset(parity[0], 0, bytes);
    for (const uint8_t* d : data) xor_into(parity[0], d, bytes);
    return;
  }
  std::vector<unsigned char> a = rs_matrix(r);
  std::vector<unsigned char> tables(static_cast<std::size_t>(32 * r.k * r.m));
  ec_init_tables(r.k, r.m, a.data() + r.k * r.k, tables.data());
  std::vector<unsigned char*> in(data.size());
  for (std::size_t i = 0; i < data.size(); ++i) in[i] = const_cast<unsigned char*>(data[i]);  // ISA-L only reads them
  std::vector<unsigned char*> out(parity.begin(), parity.end());
  // ISA-L takes an int length: encode in pieces.
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  for (std::size_t at = 0; at < bytes; at += kPiece) {
    const std::size_t n = std::min(kPiece, bytes - at);
    std::vector<unsigned char*> i2(in), o2(out);
    for (auto& p : i2) p += at;
    for (auto& p : o2) p += at;
    ec_encode_data(static_cast<int>(n), r.k, r.m, tables.data(), i2.data(), o2.data());
  }
}

Status decode_stripe(const Redundancy& r, const std::vector<uint8_t*>& segments, const std::vector<bool>& present,
                     std::size_t bytes) {
  const int total = r.k + r.m;
  std::vector<int> missing_data, available;
  for (int i = 0; i < total; ++i) {
    if (present[static_cast<std::size_t>(i)]) available.push_back(i);
    else if (i < r.k) missing_data.push_back(i);
  }
  if (missing_data.empty()) return Status();
  if (static_cast<int>(available.size()) < r.k)
    return not_found("a stripe lost " + std::to_string(total - static_cast<int>(available.size())) +
                     " of its segments; " + r.to_string() + " rebuilds at most " + std::to_string(r.m));
  if (r.kind == Redundancy::Kind::kXor) {  // one missing data segment: the XOR of the others and the parity
    uint8_t* lost = segments[static_cast<std::size_t>(missing_data[0])];
    std::memset(lost, 0, bytes);
    for (int i : available) xor_into(lost, segments[static_cast<std::size_t>(i)], bytes);
    return Status();
  }
  // Reed-Solomon: the rows of the k segments used form a k x k matrix B with
  // B x data = used; data = B^-1 x used, so the rows of B^-1 for the missing data
  // segments rebuild them (ISA-L's erasure-code example does the same).
  std::vector<unsigned char> a = rs_matrix(r);
  available.resize(static_cast<std::size_t>(r.k));
  std::vector<unsigned char> b(static_cast<std::size_t>(r.k * r.k)), inv(b.size());
  for (int i = 0; i < r.k; ++i)
    std::memcpy(&b[static_cast<std::size_t>(i * r.k)], &a[static_cast<std::size_t>(available[i] * r.k)],
                static_cast<std::size_t>(r.k));
  if (gf_invert_matrix(b.data(), inv.data(), r.k) != 0) return internal_error("Reed-Solomon: singular decode matrix");
  const int lost = static_cast<int>(missing_data.size());
  std::vector<unsigned char> rows(static_cast<std::size_t>(lost * r.k));
  for (int i = 0; i < lost; ++i)
    std::memcpy(&rows[static_cast<std::size_t>(i * r.k)], &inv[static_cast<std::size_t>(missing_data[i] * r.k)],
                static_cast<std::size_t>(r.k));
  std::vector<unsigned char> tables(static_cast<std::size_t>(32 * r.k * lost));
  ec_init_tables(r.k, lost, rows.data(), tables.data());
  std::vector<unsigned char*> in, out;
  for (int i : available) in.push_back(segments[static_cast<std::size_t>(i)]);
  for (int i : missing_data) out.push_back(segments[static_cast<std::size_t>(i)]);
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  for (std::size_t at = 0; at < bytes; at += kPiece) {
    const std::size_t n = std::min(kPiece, bytes - at);
    std::vector<unsigned char*> i2(in), o2(out);
    for (auto& p : i2) p += at;
    for (auto& p : o2) p += at;
    ec_encode_data(static_cast<int>(n), r.k, lost, tables.data(), i2.data(), o2.data());
  }
  return Status();
}

}  // namespace distckpt::internal_tier
