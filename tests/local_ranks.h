// Running a test body on N in-process ranks (threads) and checking every rank's Status.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/local_comm.h"
#include "distckpt/status.h"

namespace distckpt::testing {

// Runs fn on `world` in-process ranks; returns each rank's Status text ("ok" if fine).
inline std::vector<std::string> run_ranks(int world, const std::function<Status(Comm&)>& fn) {
  std::vector<std::string> out(static_cast<std::size_t>(world));
  std::mutex mu;
  internal_comm::run_local_ranks(world, [&](Comm& comm) {
    Status st = fn(comm);
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<std::size_t>(comm.rank())] = st.to_string();
  });
  return out;
}

inline void expect_all_ok(const std::vector<std::string>& results) {
  for (std::size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "ok") << "rank " << r;
}

}  // namespace distckpt::testing
