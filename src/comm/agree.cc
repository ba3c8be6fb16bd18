#include "comm/agree.h"

namespace distckpt::internal_comm {

std::string pack_outcome(const Status& outcome, const std::string& payload) {
  return std::string(1, static_cast<char>(outcome.code())) + (outcome.ok() ? payload : outcome.message());
}

Status unpack_outcome(const std::string& message, std::string* payload) {
  if (message.empty() || message[0] == static_cast<char>(StatusCode::kOk)) {
    if (payload != nullptr) *payload = message.empty() ? std::string() : message.substr(1);
    return Status();
  }
  return Status(static_cast<StatusCode>(static_cast<unsigned char>(message[0])), message.substr(1));
}

Status agree(Comm& comm, const Status& local) {
  const int64_t first_failed = comm.allreduce_one(local.ok() ? comm.size() : comm.rank(), ReduceOp::kMin);
  if (first_failed == comm.size()) return Status();
  std::string wire;
  if (comm.rank() == first_failed) wire = pack_outcome(local, std::string());
  comm.broadcast_string(wire, static_cast<int>(first_failed));
  return unpack_outcome(wire);
}

Compared agree_same(Comm& comm, const Status& local, const std::vector<int64_t>& words) {
  const ComparedWords compared = agree_words(comm, local, words);
  Compared c;
  c.failed = compared.failed;
  c.same = compared.all_same(0, words.size());
  return c;
}

bool ComparedWords::all_same(std::size_t begin, std::size_t end) const {
  for (std::size_t i = begin; i < end && i < same.size(); ++i)
    if (!same[i]) return false;
  return true;
}

ComparedWords agree_words(Comm& comm, const Status& local, const std::vector<int64_t>& words,
                          const std::vector<int64_t>& maxima) {
  // Everything is a minimum: max(x) = ~min(~x), for any 64-bit x (no overflow, unlike -x).
  std::vector<int64_t> v{local.ok() ? 0 : -1};
  v.insert(v.end(), words.begin(), words.end());
  for (int64_t x : words) v.push_back(~x);
  for (int64_t x : maxima) v.push_back(~x);
  comm.allreduce(v, ReduceOp::kMin);
  ComparedWords c;
  c.failed = v[0] < 0;
  const std::size_t n = words.size();
  c.same.resize(n);
  for (std::size_t i = 0; i < n; ++i) c.same[i] = v[1 + i] == words[i] && ~v[1 + n + i] == words[i];
  for (std::size_t i = 0; i < maxima.size(); ++i) c.maxima.push_back(~v[1 + 2 * n + i]);
  return c;
}

}  // namespace distckpt::internal_comm
