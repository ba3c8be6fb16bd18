#!/usr/bin/env bash
# Writes the README's C++ quickstart (its first ```cpp block, as users copy it) into a
# program: main() makes what the prose leaves out (MPI, the rank, dp x tp, W1's local rows),
# runs the block with the checkpoint root from argv[1], and checks what it saved and loaded.
# Usage: readme_quickstart.sh README.md OUTPUT.cc
set -euo pipefail
readme=$1 out=$2
{
  cat <<'PRELUDE'
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <algorithm>
#include <vector>

#include "distckpt/distckpt.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string root = argc > 1 ? argv[1] : "/tmp/distckpt-readme";
  if (rank == 0) std::filesystem::remove_all(root);  // a fresh root at each run
  MPI_Barrier(MPI_COMM_WORLD);
  const int64_t tp = size % 2 == 0 ? 2 : 1, dp = size / tp, hidden = 16, in = 8, step = 100;
  std::vector<float> w1(static_cast<std::size_t>(hidden / tp * in), static_cast<float>(rank % tp + 1));
  int failed = 0;
  {
PRELUDE
  awk '/^```cpp/{n++; if (n==1) {f=1; next}} /^```/{f=0} f && !/^#include/' "$readme" | sed 's#"/ckpt"#root#g'
  cat <<'POSTLUDE'
    std::fill(w1.begin(), w1.end(), 0.0f);  // loaded again below: the saved values come back
    auto again = distckpt::load(*comm, state, root, {});
    failed = !st.ok() || !saved.ok() || !loaded.ok() || !again.ok() || w1.front() != static_cast<float>(rank % tp + 1);
    if (failed)
      std::printf("rank %d: save %s, load %s\n", rank, saved.status().to_string().c_str(),
                  again.status().to_string().c_str());
  }
  if (rank == 0 && !failed) std::printf("readme quickstart: saved and loaded\n");
  MPI_Finalize();
  return failed;
}
POSTLUDE
} >"$out"
