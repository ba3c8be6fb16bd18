// ckpt_bench: times distckpt::save and distckpt::load of the benchmark workload
// (/work/shared/bench/WORKLOAD.md) on DP x TP MPI ranks, then verifies every loaded
// element.
//
//   mpirun -np 4 ckpt_bench --size 1G --dp 2 --tp 2 --dir /dev/shm/ck --json
//
// Each rank generates its slices once, before any timing (allocation and first touch of
// the state buffers are excluded from every figure). A timed phase starts after a
// barrier and its time is the maximum over ranks.
//
// Exit status (identical on all ranks): 0 success, 1 a distckpt error, 2 bad arguments
// (including a world size other than dp*tp), 3 loaded data differs from the workload.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "workload.h"

namespace {

using distckpt::Box;
using distckpt::Status;
using distckpt::bench::WorkloadTensor;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitMismatch = 3;
constexpr const char* kTimingNote = "excludes generation and first touch";

struct Args {
  std::string size = "256M";
  uint64_t seed = 0;
  int dp = 0;  // 0: world size / tp
  int tp = 1;
  std::string dir;
  std::string mode = "both";
  bool json = false;
  std::string name = "bench";
  bool keep = false;
};

// One tensor's slice on this rank: the box it holds and a buffer owned by the bench.
struct Slice {
  const WorkloadTensor* tensor = nullptr;
  Box box;
  size_t elements = 0;
  std::unique_ptr<float[]> data;  // at least one element, so empty boxes get a pointer
};

// Collective: true when `ok` holds on every rank. Used for local steps (argument checks,
// setup, cleanup on rank 0) so that no rank is left waiting in a later collective.
bool all_ok(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Collective: max over ranks of this rank's elapsed seconds.
double max_over_ranks(double seconds) {
  double out = 0;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

std::string human_bytes(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

int run(int rank, int world, int argc, char** argv) {
  const bool root = rank == 0;
  Args a;
  CLI::App app{"Times distckpt save/load of the synthetic workload (shared/bench/WORKLOAD.md)."};
  app.add_option("--size", a.size, "target state size, bytes with K/M/G suffix")->capture_default_str();
  app.add_option("--seed", a.seed, "value seed")->capture_default_str();
  app.add_option("--dp", a.dp, "data-parallel degree (default: world size / tp)")
      ->check(CLI::PositiveNumber);
  app.add_option("--tp", a.tp, "tensor-parallel degree")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dir", a.dir, "checkpoint root directory")->required();
  app.add_option("--mode", a.mode, "phases to run")
      ->check(CLI::IsMember({"save", "load", "both"}))
      ->capture_default_str();
  app.add_flag("--json", a.json, "print one JSON line instead of text");
  app.add_option("--name", a.name, "checkpoint name under --dir")->capture_default_str();
  app.add_flag("--keep", a.keep, "mode both: keep the checkpoint instead of removing it");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = root ? app.exit(e) : e.get_exit_code();  // only rank 0 prints
    return code == 0 ? 0 : kExitUsage;
  }

  // ---- arguments and workload (deterministic: every rank reaches the same verdict) ----
  if (a.dp == 0) a.dp = world % a.tp == 0 ? world / a.tp : -1;
  if (a.dp < 1 || static_cast<int64_t>(a.dp) * a.tp != world) {
    if (root) {
      std::cerr << "ckpt_bench: world size " << world << " is not dp x tp (dp="
                << (a.dp < 1 ? std::string("?") : std::to_string(a.dp)) << ", tp=" << a.tp
                << "); start dp*tp ranks or pass matching --dp/--tp\n";
    }
    return kExitUsage;
  }
  auto size = distckpt::bench::parse_size(a.size);
  if (!size.ok()) {
    if (root) std::cerr << "ckpt_bench: --size: " << size.status().to_string() << "\n";
    return kExitUsage;
  }
  auto tensors = distckpt::bench::workload_tensors(*size);
  if (!tensors.ok()) {
    if (root) std::cerr << "ckpt_bench: --size: " << tensors.status().to_string() << "\n";
    return kExitUsage;
  }
  const bool do_save = a.mode != "load";
  const bool do_load = a.mode != "save";
  const std::string path = a.dir + "/" + a.name;

  // ---- setup: generate this rank's slices (allocation + first touch, not timed) ----
  std::unique_ptr<distckpt::Comm> comm = distckpt::make_mpi_comm(MPI_COMM_WORLD);
  distckpt::StateDict state(rank);
  std::vector<Slice> slices;
  slices.reserve(tensors->size());
  uint64_t rank_bytes = 0;
  Status setup;
  const double gen_start = MPI_Wtime();
  for (const WorkloadTensor& t : *tensors) {
    auto layout = distckpt::bench::workload_layout(t, a.dp, a.tp);
    if (!layout.ok()) {
      setup = layout.status();
      break;
    }
    std::vector<Box> boxes = layout->boxes_of(rank);
    if (boxes.size() != 1) {
      setup = distckpt::internal_error("ckpt_bench: rank " + std::to_string(rank) + ": tensor '" +
                                       t.name + "': layout gives " + std::to_string(boxes.size()) +
                                       " boxes, expected 1");
      break;
    }
    Slice s;
    s.tensor = &t;
    s.box = std::move(boxes[0]);
    s.elements = static_cast<size_t>(s.box.num_elements());
    s.data.reset(new float[s.elements > 0 ? s.elements : 1]);
    distckpt::bench::fill_slice(a.seed, t, s.box, s.data.get());
    rank_bytes += s.elements * sizeof(float);
    setup = state.add_tensor(t.name, distckpt::DType::kFloat32, s.data.get(), *layout);
    if (!setup.ok()) break;
    slices.push_back(std::move(s));
  }
  const double gen_s = max_over_ranks(MPI_Wtime() - gen_start);
  if (!all_ok(setup.ok())) {
    if (root) {
      std::cerr << "ckpt_bench: setup failed: "
                << (setup.ok() ? std::string("on another rank") : setup.to_string()) << "\n";
    }
    return kExitError;
  }

  // ---- save ----
  std::optional<double> save_s;
  std::array<double, 3> phases{};  // plan, write, commit
  std::optional<distckpt::SaveResult> saved;
  if (do_save) {
    Status removed;
    if (a.mode == "both" && root) {
      auto fs = distckpt::posix_filesystem();
      if (fs->exists(path)) removed = fs->remove_all(path);
    }
    if (!all_ok(removed.ok())) {
      if (root) std::cerr << "ckpt_bench: removing old " << path << ": " << removed.to_string() << "\n";
      return kExitError;
    }
    distckpt::SaveOptions opts;
    opts.name = a.name;
    opts.step = 0;
    // In mode both the checkpoint is removed at the end: do not leave `latest` dangling.
    opts.update_latest = a.mode != "both";
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    auto r = distckpt::save(*comm, state, a.dir, opts);
    save_s = max_over_ranks(MPI_Wtime() - t0);
    if (!r.ok()) {  // identical on every rank
      if (root) std::cerr << "ckpt_bench: save: " << r.status().to_string() << "\n";
      return kExitError;
    }
    saved = std::move(r).value();
    phases = {max_over_ranks(saved->plan_s), max_over_ranks(saved->write_s), max_over_ranks(saved->commit_s)};
  }

  // ---- load + verify ----
  std::optional<double> load_s;
  std::optional<distckpt::LoadResult> loaded;
  uint64_t mismatches = 0;
  if (do_load) {
    for (Slice& s : slices) std::memset(s.data.get(), 0, s.elements * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    auto r = distckpt::load(*comm, state, path, distckpt::LoadOptions{});
    load_s = max_over_ranks(MPI_Wtime() - t0);
    if (!r.ok()) {
      if (root) std::cerr << "ckpt_bench: load: " << r.status().to_string() << "\n";
      return kExitError;
    }
    loaded = std::move(r).value();
    uint64_t mine = 0;
    for (const Slice& s : slices) {
      mine += distckpt::bench::check_slice(a.seed, *s.tensor, s.box, s.data.get());
    }
    MPI_Allreduce(&mine, &mismatches, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  }

  // ---- report (rank 0) ----
  const uint64_t bytes_unique =
      saved ? saved->bytes_unique : distckpt::bench::workload_bytes(*tensors);
  auto gbps = [bytes_unique](double s) { return s > 0 ? bytes_unique / 1e9 / s : 0.0; };
  const bool verified = do_load && mismatches == 0;
  if (root) {
    if (a.json) {
      using json = nlohmann::ordered_json;  // keys in the documented order
      json j;
      j["size"] = *size;
      j["ranks"] = world;
      j["dp"] = a.dp;
      j["tp"] = a.tp;
      j["dir"] = a.dir;
      j["mode"] = a.mode;
      j["tensors"] = tensors->size();
      j["save_s"] = save_s ? json(*save_s) : json(nullptr);
      j["load_s"] = load_s ? json(*load_s) : json(nullptr);
      j["bytes_unique"] = bytes_unique;
      j["bytes_written"] = saved ? json(saved->bytes_written) : json(nullptr);
      j["bytes_read"] = loaded ? json(loaded->bytes_read) : json(nullptr);
      j["save_gbps"] = save_s ? json(gbps(*save_s)) : json(nullptr);
      // Where a save's time goes: each phase's maximum over ranks.
      j["save_plan_s"] = saved ? json(phases[0]) : json(nullptr);
      j["save_write_s"] = saved ? json(phases[1]) : json(nullptr);
      j["save_commit_s"] = saved ? json(phases[2]) : json(nullptr);
      j["load_gbps"] = load_s ? json(gbps(*load_s)) : json(nullptr);
      j["verified"] = do_load ? json(verified) : json(nullptr);
      j["mismatches"] = do_load ? json(mismatches) : json(nullptr);
      j["timing_note"] = kTimingNote;
      std::cout << j.dump() << std::endl;
    } else {
      std::printf("ckpt_bench: %zu tensors, %s unique (%llu bytes), %d ranks (dp=%d x tp=%d), %s\n",
                  tensors->size(), human_bytes(bytes_unique).c_str(),
                  static_cast<unsigned long long>(bytes_unique), world, a.dp, a.tp, path.c_str());
      std::printf("setup: rank 0 holds %s, generated in %.3f s (not timed below)\n",
                  human_bytes(rank_bytes).c_str(), gen_s);
      if (save_s) {
        std::printf("save: %.3f s  %.3f GB/s  bytes_written %llu\n", *save_s, gbps(*save_s),
                    static_cast<unsigned long long>(saved->bytes_written));
      }
      if (load_s) {
        std::printf("load: %.3f s  %.3f GB/s  bytes_read %llu  %s (%llu mismatches)\n", *load_s,
                    gbps(*load_s), static_cast<unsigned long long>(loaded->bytes_read),
                    verified ? "verified" : "VERIFICATION FAILED",
                    static_cast<unsigned long long>(mismatches));
      }
      std::printf("timings exclude generation and first touch; each is the max over ranks, after a barrier\n");
      std::fflush(stdout);
    }
  }

  // ---- cleanup ----
  if (a.mode == "both" && !a.keep) {
    Status removed;
    if (root) removed = distckpt::posix_filesystem()->remove_all(path);
    if (!all_ok(removed.ok())) {
      if (root) std::cerr << "ckpt_bench: removing " << path << ": " << removed.to_string() << "\n";
      return kExitError;
    }
  }
  if (do_load && !verified) {
    if (root) {
      std::cerr << "ckpt_bench: " << mismatches << " loaded elements differ from the workload\n";
    }
    return kExitMismatch;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int code = run(rank, world, argc, argv);  // destroys its Comm before MPI_Finalize
  MPI_Finalize();
  return code;
}
