// Planning-only simulation: no MPI, no tensor bytes. Plans the save of a transformer-like
// model by thousands of simulated ranks (DP x TP x PP) and its load onto another layout
// with the planner code real saves and loads run (plan_save, describe/fingerprint,
// index framing and validation, ChunkLookup, replica groups), and reports what each step
// costs. Used by `ckpt_bench --simulate-ranks N`.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/status.h"

namespace distckpt::internal_plan {

struct Parallelism {
  int dp = 0;  // 0: ranks / (tp * pp)
  int tp = 1;
  int pp = 1;
};

struct SimulationConfig {
  int ranks = 16384;
  int tensors = 2000;          // 6 per layer: qkv, proj, fc1, fc1 bias, fc2, norm
  int64_t hidden = 4096;       // bfloat16 weights of hidden x hidden multiples
  Parallelism save{0, 8, 16};
  int load_ranks = 0;          // 0: the same as ranks
  Parallelism load{0, 4, 8};
};

struct SimulationReport {
  int save_dp = 0, load_dp = 0, load_ranks = 0;
  uint64_t state_bytes = 0;         // the model's unique bytes
  // Save, per rank: its state description and fingerprint (what ranks agree on).
  double describe_s = 0;
  uint64_t description_bytes = 0;   // gathered only to explain a mismatch
  // Save, rank 0: the plan for every rank, then the framed index.
  double plan_save_s = 0;
  double frame_index_s = 0;
  uint64_t index_bytes = 0;
  uint64_t chunks = 0;
  uint64_t files = 0;
  uint64_t writer_max_bytes = 0;    // the busiest writer's bytes
  // Busiest writer / its lower bound, max(largest slice, unique bytes / ranks): 1.0 is
  // the best any assignment of whole slices to holders can do.
  double writer_balance = 0;
  // Load, per rank: parse and validate the index, build the chunk lookups.
  double parse_index_s = 0;
  double build_lookups_s = 0;
  // Load: each simulated rank's read plan and replica groups for its boxes.
  double plan_load_total_s = 0;     // all ranks, one after another
  double plan_load_max_s = 0;       // the slowest rank
  uint64_t reads = 0;               // summed over ranks
  uint64_t bytes_needed = 0;        // summed over ranks
  uint64_t bytes_needed_expected = 0;  // each tensor's bytes x its replicas in the load layout
};

// Errors: kInvalidArgument for a configuration that is not a valid layout (ranks not
// dp x tp x pp, hidden not divisible by tp, fewer tensors than pipeline stages, ...),
// kInternal if a plan does not cover a box (a planner bug).
Result<SimulationReport> simulate_planning(const SimulationConfig& config);

}  // namespace distckpt::internal_plan
