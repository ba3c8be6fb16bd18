// A real crash during a save, a commit or retention, then a check of what survived
// (HDF5's t_pflush1 / t_pflush2 pattern). Registered in CTest as a pair per kill point:
//
//   crash_mid_save crash DIR [all:]OP[:MATCH]   saves "step-1", then starts "step-2" and
//       SIGKILLs one rank (the last rank for data ops, rank 0 for commit ops; with
//       "all:", every rank that reaches the point) when it is about to perform
//       file-system operation OP on a path containing MATCH.
//   crash_mid_save crash-retain DIR OP[:MATCH]   the checkpoint manager saves step-1..3
//       with keep_max 2; rank 0 is killed at OP during the retention that follows step-3's
//       commit (removing step-1): "rename" is step-1's rename, "sync_dir" the sync after
//       it, "remove:MATCH" the removal of the renamed directory.
//   crash_mid_save check DIR STEP [NAME...]   every listed checkpoint is committed (none
//       broken) and verifies (every byte re-read: verify --deep), each NAME is among them,
//       no in-flight directory is listed as committed, and loading the root gives step
//       STEP (the newest committed checkpoint) with that step's values.
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "storage/fault_fs.h"

namespace {

using namespace distckpt;

int rank_of() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Incremental modes (crash-incr, crash-retain-incr, check-incr): the bias never
// changes and the weight only from step 3 on, so that later saves reference files of
// earlier ones.
bool g_incremental = false;

// A weight split over all ranks plus a replicated bias; values depend on the step.
struct Model {
  std::vector<float> w, b;
  StateDict state{rank_of()};
  explicit Model(int step) : w(32), b(8) {
    const int world = size_of();
    auto wl = TensorLayout::from_device_matrix({4L * world, 8}, {world}, {0, -1});
    auto bl = TensorLayout::from_device_matrix({8}, {world}, {-1});
    set(step);
    if (!state.add_tensor("w", DType::kFloat32, w.data(), *wl).ok() ||
        !state.add_tensor("b", DType::kFloat32, b.data(), *bl).ok())
      MPI_Abort(MPI_COMM_WORLD, 3);
  }
  void set(int step) {  // the values of `step`, in place (the state dict keeps its buffers)
    const int w_step = g_incremental && step < 3 ? 1 : step, b_step = g_incremental ? 1 : step;
    for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(w_step * 1000 + rank_of() * 32 + i);
    for (int i = 0; i < 8; ++i) b[i] = static_cast<float>(b_step * 100 + i);
  }
};

// Dies like a node losing power would take the process: SIGKILL, no handlers, no core.
[[noreturn]] void die_at(const std::string& op, const std::string& path) {
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  std::fprintf(stderr, "rank %d: crashing at %s '%s' (kill point)\n", rank_of(), op.c_str(), path.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

int fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: CHECK FAILED: %s\n", rank_of(), what.c_str());
  return 1;
}

int crash(const std::string& dir, const std::string& point) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  if (rank_of() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  Model first(1);
  SaveOptions opts;
  opts.name = "step-1";
  opts.step = 1;
  opts.incremental = g_incremental;
  auto saved = save(*comm, first.state, dir, opts);
  if (!saved.ok()) return fail(saved.status().to_string());

  const bool everyone = point.rfind("all:", 0) == 0;
  const std::string spec_text = everyone ? point.substr(4) : point;
  const std::string op = spec_text.substr(0, spec_text.find(':'));
  const std::string match = spec_text.find(':') == std::string::npos ? "" : spec_text.substr(spec_text.find(':') + 1);
  const bool data_op = match.find("data-") != std::string::npos;  // a data file: the last rank writes one
  const int victim = data_op ? size_of() - 1 : 0;
  internal_storage::FaultSpec spec;
  spec.hook = [&](const std::string& o, const std::string& path) {
    if (o == op && path.find(match) != std::string::npos) die_at(o, path);
  };
  if (everyone || rank_of() == victim)
    opts.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  Model second(2);
  opts.name = "step-2";
  opts.step = 2;
  saved = save(*comm, second.state, dir, opts);
  // Reaching this point means the kill point was never hit: the test pair is wrong.
  return fail("kill point '" + point + "' was not reached (" + saved.status().to_string() + ")");
}

int crash_retention(const std::string& dir, const std::string& point) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  if (rank_of() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string op = point.substr(0, point.find(':'));
  const std::string match = point.find(':') == std::string::npos ? "" : point.substr(point.find(':') + 1);
  bool renamed_away = false;  // retention's rename of step-1 happened (commits rename "*.tmp-*")
  internal_storage::FaultSpec spec;
  spec.hook = [&](const std::string& o, const std::string& path) {
    // Commits rename "<name>.tmp-<id>" and `latest`; only retention renames "<dir>/step-1".
    // (Retirement renames step-1's index away first, then the directory.)
    const bool retention_rename = o == "rename" && (path == dir + "/step-1/index.pb" || path == dir + "/step-1");
    const bool hit = o == op && (op == "rename" ? retention_rename : path.find(match) != std::string::npos);
    if (hit && (op != "sync_dir" || renamed_away)) die_at(o, path);
    if (retention_rename) renamed_away = true;
  };
  Model m(1);
  CheckpointConfig cfg;
  cfg.directory = dir;
  cfg.prefix = "step";
  cfg.name_template = "{prefix}-{step}";
  cfg.save_every_steps = 1;
  cfg.keep_max = 2;
  cfg.incremental = g_incremental;
  if (rank_of() == 0) cfg.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  auto manager = CheckpointManager::create(*comm, m.state, cfg);
  if (!manager.ok()) return fail(manager.status().to_string());
  // Incremental: step-1's files stay referenced until step 4, whose retention frees
  // those that only step-1 and step-2 used (the weight changed at step 3).
  for (int step = 1; step <= (g_incremental ? 4 : 3); ++step) {
    m.set(step);
    auto out = (*manager)->step_end(step, 0);
    if (!out.ok()) return fail(out.status().to_string());
  }
  return fail("kill point '" + point + "' was not reached during retention");
}

int check(const std::string& dir, int64_t expected_step, const std::vector<std::string>& must_have) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  int bad = 0;
  if (rank_of() == 0) {
    auto listing = list_checkpoints(dir);
    if (!listing.ok()) return fail(listing.status().to_string());
    std::vector<std::string> verified;
    VerifyOptions deep;
    deep.deep = true;
    for (const auto& e : listing->entries) {
      std::printf("%s: %s %s\n", e.name.c_str(),
                  e.state == EntryState::kCommitted  ? "committed"
                  : e.state == EntryState::kInFlight ? "in-flight"
                  : e.state == EntryState::kRetired  ? "retired"
                                                      : "broken",
                  e.detail.c_str());
      if (e.state == EntryState::kBroken) bad |= fail("broken directory " + e.name);
      if (e.state != EntryState::kCommitted) continue;
      auto v = verify_checkpoint(dir + "/" + e.name, deep);
      if (!v.ok()) bad |= fail(e.name + ": " + v.status().to_string());
      else verified.push_back(e.name);
      if (e.name.find(".tmp-") != std::string::npos) bad |= fail("in-flight listed as committed");
    }
    for (const auto& name : must_have)
      if (std::find(verified.begin(), verified.end(), name) == verified.end())
        bad |= fail("committed checkpoint " + name + " is missing or damaged");
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  // The newest committed checkpoint loads, with the values of its step.
  Model m(0);
  auto loaded = load(*comm, m.state, dir, {});
  if (!loaded.ok()) return fail(loaded.status().to_string());
  if (loaded->step != expected_step)
    bad |= fail("resume loads step " + std::to_string(loaded->step) + ", expected " + std::to_string(expected_step));
  Model expected(static_cast<int>(loaded->step));
  if (m.w != expected.w || m.b != expected.b) bad |= fail("loaded values differ from step " + std::to_string(loaded->step));
  if (rank_of() == 0) std::printf("resume would load step %lld\n", static_cast<long long>(loaded->step));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 2;
  if (argc == 4 && std::strcmp(argv[1], "crash") == 0) rc = crash(argv[2], argv[3]);
  else if (argc == 4 && std::strcmp(argv[1], "crash-retain") == 0) rc = crash_retention(argv[2], argv[3]);
  else if (argc == 4 && std::strcmp(argv[1], "crash-incr") == 0) rc = (g_incremental = true, crash(argv[2], argv[3]));
  else if (argc == 4 && std::strcmp(argv[1], "crash-retain-incr") == 0)
    rc = (g_incremental = true, crash_retention(argv[2], argv[3]));
  else if (argc >= 4 && (std::strcmp(argv[1], "check") == 0 || std::strcmp(argv[1], "check-incr") == 0))
    rc = (g_incremental = std::strcmp(argv[1], "check-incr") == 0,
          check(argv[2], std::atoll(argv[3]), std::vector<std::string>(argv + 4, argv + argc)));
  else if (rank_of() == 0)
    std::fprintf(stderr, "usage: crash_mid_save crash|crash-retain DIR [all:]OP[:MATCH] | check DIR STEP [NAME...]\n");
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
