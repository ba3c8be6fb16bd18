// Helpers for tests run under mpirun.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace distckpt::testing {

// A directory shared by all ranks (rank 0 creates it, all remove nothing; rank 0
// removes it at destruction after a barrier). Collective.
class SharedTempDir {
 public:
  SharedTempDir() {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char buf[4096] = {0};
    if (rank == 0) {
      const char* base = std::getenv("DISTCKPT_TEST_TMP");
      std::string b = base ? base : "/tmp";
      std::filesystem::create_directories(b);
      std::string tmpl = b + "/distckpt-mpi-XXXXXX";
      std::snprintf(buf, sizeof(buf), "%s", mkdtemp(tmpl.data()));
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::error_code ec;
    if (rank == 0) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// True on every rank iff `ok` is true on every rank (so all ranks take the same branch).
inline bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Expects `message` to be identical on every rank (rank 0's text is the reference).
inline void expect_same_on_all_ranks(const std::string& message) {
  int n = static_cast<int>(message.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string root(static_cast<std::size_t>(n), '\0');
  if (world_rank() == 0) root = message;
  MPI_Bcast(root.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message, root) << "rank " << world_rank() << " disagrees with rank 0";
}

}  // namespace distckpt::testing
