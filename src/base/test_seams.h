// Test seams for byte-exact outputs: a fixed wall clock and a seeded random source, so
// that a test can write the same checkpoint twice and compare every byte (tests/golden).
//
//   DISTCKPT_TEST_CLOCK_MS=<ms>   wall_clock_ms() returns <ms> (the times recorded in
//                                 indexes, single files' metadata and stats, and the
//                                 manager's clock, so time-based retention sees no time
//                                 pass);
//   DISTCKPT_TEST_RANDOM_SEED=<n> seeded_random_bytes() fills from a generator seeded
//                                 with <n>, the same sequence in every process (salts
//                                 and IVs become predictable: the first use prints a
//                                 warning on stderr; never set it in a job). Identities
//                                 (node ids, temporary names) never come from it.
//
// Liveness (owner records, heartbeats, leases) keeps the real clock: a fixed one would
// make every owner look alive or dead. Without the variables each call costs one getenv
// read at first use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distckpt::internal_base {

// Milliseconds since the Unix epoch (system clock), or DISTCKPT_TEST_CLOCK_MS. Any thread.
int64_t wall_clock_ms();

// With DISTCKPT_TEST_RANDOM_SEED set, fills `n` bytes at `out` from the seeded generator
// (one sequence per process, shared by all threads) and returns true; otherwise writes
// nothing and returns false, and the caller uses its cryptographic source. Any thread.
bool seeded_random_bytes(void* out, std::size_t n);

}  // namespace distckpt::internal_base
