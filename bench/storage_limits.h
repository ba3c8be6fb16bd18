// The references the benchmarks time beside the library, in the same run and directory:
// the storage's limit by fio (--compare-limit) and a dd-like write and read
// (--compare-dd). Rank 0 does the I/O; the other ranks wait without taking CPU
// (quiet_mpi.h), and fio runs on every CPU of the machine whatever rank 0 is bound to,
// as fio run alone would.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace distckpt::bench {

// One fio reference: the slowest job's runtime of a write job and of the read job that
// reads its files back (each the median of 3 rounds), and the two job files as fio ran them (--json prints them, and
// bench/check_limits.py runs the same files outside the MPI job). Times are -1 where
// fio could not run (the message said why).
struct FioLimit {
  double write_s = -1;
  double read_s = -1;
  std::string write_job;
  std::string read_job;
  int cpus = 0;  // the CPUs fio could run on
  std::string tool = "fio";  // what measured it: fio, or curl for an object root
};

// Collective. The limit of the storage under `dir`: one job per rank writing
// `rank_bytes[r]` (only rank 0's vector is read) in 8 MiB blocks into a new file
// (fallocate=none, O_DIRECT where the file system takes it, an fsync at the end), then
// every file read once, cold (fio invalidates each file's cache first). Called with each
// rank's share of a save, the read is the unique bytes once; called with each rank's
// state, it is what a load lands. Three rounds of both, each time the median; the files are
// removed and the removal committed after each round. The result is rank 0's, on every rank.
FioLimit fio_limit(const std::string& dir, const std::vector<uint64_t>& rank_bytes, bool root);

// Collective. The limit of the object store under `dir` (s3://bucket/prefix), by curl:
// each rank PUTs its share `rank_bytes[r]` (rank 0's vector) as one object streamed from
// memory, then GETs it back; the slowest rank's times, each the median of 3 rounds
// (bench/object_limit.cc). The result is on every rank; -1 where curl failed.
FioLimit object_limit(const std::string& dir, const std::vector<uint64_t>& rank_bytes, bool root);

// Collective. --compare-dd's reference: rank 0 writes `bytes` sequentially in 4 MiB
// blocks through the page cache (as `dd bs=4M conv=fsync`), fsyncs, evicts the file from
// the page cache (tmpfs keeps it, being memory), reads it back, and removes it.
// Returns {write_s, read_s} on every rank, {-1, -1} when the write or the read failed
// (the message says why).
std::array<double, 2> dd_reference(const std::string& dir, uint64_t bytes, bool root);

// The median of `v` (0 when empty). Local.
double median(std::vector<double> v);

// Commits the deletes made under the directory of `path`, so that they are not charged
// to the next timed write. On a file system mounted with online discard (ext4 `-o
// discard`) the journal commit that follows a delete discards every freed block, and
// until it has, those blocks cannot be reused. Local; best effort.
void settle_deletes(const std::string& path);

}  // namespace distckpt::bench
