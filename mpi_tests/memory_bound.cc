// The memory each public operation takes beyond the state, measured against the bound
// its header states (docs/guide/cpp.md "Memory each operation takes"). One operation per
// process, on the 256 MiB workload of bench/workload.h at DP2 x TP2 (4 ranks):
//
//   mpirun -np 4 memory_bound OP DIR      OP: save async load reshard integrated convert publish
//
// After the state is generated (and, for load, reshard, convert and publish, a
// checkpoint saved by a previous phase of this process), every rank resets its peak RSS
// (`echo 5 > /proc/self/clear_refs`), runs the operation, and reads VmHWM. The extra
// memory is VmHWM minus the resident set at the reset, minus what grew in file-backed
// and shared-memory pages (mapped libraries, MPI's shared segments): anonymous memory,
// which is what the bounds are about. A rank over its bound fails the test, printing
// both. Under sanitizers (their shadow memory and quarantine are not ours) it exits 77:
// CTest reports it skipped.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "proc_status.h"
#include "workload.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DISTCKPT_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DISTCKPT_UNDER_SANITIZER 1
#endif
#endif

namespace {

using distckpt::Box;
using distckpt::Status;
using distckpt::bench::WorkloadTensor;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kWorkloadBytes = 256 * kMiB;

// This rank's slices of the workload under dp x tp, and the state dict over them.
struct State {
  std::vector<WorkloadTensor> tensors;
  std::vector<std::unique_ptr<float[]>> buffers;
  distckpt::StateDict dict;
  uint64_t bytes = 0;
  explicit State(int rank) : dict(rank) {}
};

Status make_state(State& s, int rank, int dp, int tp, bool fill) {
  DISTCKPT_ASSIGN_OR_RETURN(s.tensors, distckpt::bench::workload_tensors(kWorkloadBytes));
  for (const WorkloadTensor& t : s.tensors) {
    DISTCKPT_ASSIGN_OR_RETURN(auto layout, distckpt::bench::workload_layout(t, dp, tp));
    const Box box = layout.boxes_of(rank).at(0);
    const auto n = static_cast<std::size_t>(std::max<int64_t>(1, box.num_elements()));
    s.buffers.emplace_back(new float[n]);
    if (fill) distckpt::bench::fill_slice(7, t, box, s.buffers.back().get());
    else std::memset(s.buffers.back().get(), 0, n * sizeof(float));  // touched: part of the state
    s.bytes += static_cast<uint64_t>(box.num_elements()) * sizeof(float);
    DISTCKPT_RETURN_IF_ERROR(s.dict.add_tensor(t.name, distckpt::DType::kFloat32, s.buffers.back().get(), layout));
  }
  return Status();
}

// The bound each operation's header states, for this workload on this rank. `index`:
// the index's bytes (rank 0 holds the plan and index; O(index) below is 8 x its size).
// `slack` covers the allocator's and MPI's own growth (request queues, eager buffers).
struct Bound {
  uint64_t bytes = 0;
  std::string text;
};
constexpr uint64_t kSlack = 16 * kMiB;

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::unique_ptr<distckpt::AsyncCheckpointer> async;  // freed before MPI_Finalize
  auto finish = [&](int rc) {
    async.reset();
    MPI_Finalize();
    return rc;
  };
#ifdef DISTCKPT_UNDER_SANITIZER
  if (rank == 0) std::printf("SKIPPED: memory bounds are not measured under sanitizers\n");
  return finish(77);
#endif
  if (argc != 3 || world != 4) {
    if (rank == 0) std::fprintf(stderr, "usage: mpirun -np 4 memory_bound OP DIR\n");
    return finish(2);
  }
  const std::string op = argv[1], dir = argv[2];
  auto comm = distckpt::make_mpi_comm(MPI_COMM_WORLD);
  State state(rank);
  Status st = make_state(state, rank, 2, 2, true);
  auto fail = [&](const std::string& what, const Status& s) {
    std::fprintf(stderr, "memory_bound %s: rank %d: %s: %s\n", op.c_str(), rank, what.c_str(), s.to_string().c_str());
    return finish(1);
  };
  if (!st.ok()) return fail("workload", st);

  // What the operation reads is written first, outside the measurement.
  const bool reads = op == "load" || op == "reshard" || op == "convert" || op == "publish" || op == "incremental";
  uint64_t index_bytes = 0, largest_chunk = 0;
  if (reads) {
    if (rank == 0) (void)distckpt::posix_filesystem()->remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    distckpt::SaveOptions o;
    o.name = "src";
    o.incremental = op == "incremental";  // the base of the incremental save measured
    auto saved = distckpt::save(*comm, state.dict, dir, o);
    if (!saved.ok()) return fail("saving the source", saved.status());
    index_bytes = saved->index_bytes;
    auto info = distckpt::read_checkpoint_info(dir + "/src");
    if (!info.ok()) return fail("reading the source", info.status());
    for (const auto& t : info->tensors)
      for (const auto& c : t.chunks) largest_chunk = std::max(largest_chunk, c.length);
  }
  // A second state for a reshard (DP1 x TP4): allocated and touched before the reset.
  std::unique_ptr<State> target;
  if (op == "reshard") {
    target = std::make_unique<State>(rank);
    st = make_state(*target, rank, 1, 4, false);
    if (!st.ok()) return fail("reshard target", st);
  }
  distckpt::AsyncOptions async_options;
  if (op == "async") {
    auto made = distckpt::make_async_checkpointer(MPI_COMM_WORLD, async_options);
    if (!made.ok()) return fail("async checkpointer", made.status());
    async = std::move(made).value();
  }
  if (rank == 0 && !reads) (void)distckpt::posix_filesystem()->remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  // Reset the peak, run, read the peak.
  distckpt::bench::reset_peak_rss();
  const auto before = distckpt::bench::proc_status();
  // A kernel (or a sandbox) that did not reset the peak would charge the operation with
  // earlier peaks: say so and skip, on every rank alike.
  int unreset = before.count("VmHWM") == 0 || before.count("VmRSS") == 0 ||
                before.at("VmHWM") > before.at("VmRSS") + 4 * kMiB;
  MPI_Allreduce(MPI_IN_PLACE, &unreset, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (unreset) {
    if (rank == 0) std::printf("SKIPPED: the peak RSS cannot be reset here (/proc/self/clear_refs)\n");
    return finish(77);
  }
  const uint64_t rank_writes = state.bytes / 2;  // DP2: replicas removed, writing balanced
  Bound bound;
  distckpt::SaveOptions save_options;
  save_options.name = "out";
  if (op == "save") {
    auto r = distckpt::save(*comm, state.dict, dir, save_options);
    if (!r.ok()) return fail("save", r.status());
    index_bytes = r->index_bytes;
    bound = {32 * kMiB, "32 MiB of direct-I/O staging + O(index)"};
  } else if (op == "incremental") {
    // Nothing changed since "src": every chunk is hashed, none is written.
    save_options.incremental = true;
    save_options.incremental_base = "src";
    auto r = distckpt::save(*comm, state.dict, dir, save_options);
    if (!r.ok()) return fail("incremental save", r.status());
    if (r->bytes_written != 0) return fail("incremental save", distckpt::internal_error("wrote unchanged chunks"));
    bound = {32 * kMiB, "as save, + the base's index on rank 0 (O(index))"};
  } else if (op == "async") {
    st = async->save_async(state.dict, dir, save_options);
    auto r = st.ok() ? async->wait() : distckpt::Result<distckpt::SaveResult>(st);
    if (!r.ok()) return fail("async save", r.status());
    index_bytes = r->index_bytes;
    // The staging pool holds what this rank writes, capped by staging_bytes, in slabs.
    const uint64_t slab = async_options.slab_bytes;
    const uint64_t staged = (std::min<uint64_t>(async_options.staging_bytes, rank_writes) + slab - 1) / slab * slab;
    bound = {std::max(staged, 2 * slab), "min(staging_bytes, bytes this rank writes) in slabs + O(index)"};
  } else if (op == "load") {
    auto r = distckpt::load(*comm, state.dict, dir + "/src", {});
    if (!r.ok()) return fail("load", r.status());
    bound = {32 * kMiB + largest_chunk + kMiB + 5 * kMiB,
             "32 MiB of direct-read staging + largest chunk + 1 MiB of small pieces + 4 MiB of receive slots and "
             "512 KiB bounce buffers (where receives and reads bounce) + O(index)"};
  } else if (op == "reshard") {
    auto r = distckpt::load(*comm, target->dict, dir + "/src", {});
    if (!r.ok()) return fail("reshard", r.status());
    bound = {32 * kMiB + largest_chunk + kMiB + 5 * kMiB,
             "32 MiB of direct-read staging + largest chunk + 1 MiB of small pieces + 4 MiB of receive slots and "
             "512 KiB bounce buffers (where receives and reads bounce) + O(index)"};
  } else if (op == "integrated") {
    save_options.format = distckpt::Format::kCkpt;
    auto r = distckpt::save(*comm, state.dict, dir, save_options);
    if (!r.ok()) return fail("integrated save", r.status());
    // The writer (rank 0) holds two gathered regions and stages non-contiguous pieces.
    bound = rank == save_options.writer_rank
                ? Bound{3 * save_options.gather_bytes, "writer: 3 x gather_bytes"}
                : Bound{save_options.gather_bytes, "others: 1 x gather_bytes of pieces in flight"};
  } else if (op == "convert" || op == "publish") {
    if (rank == 0) {
      if (op == "convert") {
        auto r = distckpt::convert_checkpoint(dir + "/src", dir + "/out", distckpt::Format::kSafetensors);
        if (!r.ok()) return fail("convert", r.status());
      } else {
        auto r = distckpt::publish_checkpoint(dir + "/src");
        if (!r.ok()) return fail("publish", r.status());
      }
    }
    distckpt::ConvertOptions defaults;
    bound = rank == 0 ? Bound{defaults.region_bytes + largest_chunk, "region_bytes + largest chunk + O(index)"}
                      : Bound{0, "nothing (rank 0 converts)"};
  } else {
    if (rank == 0) std::fprintf(stderr, "memory_bound: unknown operation '%s'\n", op.c_str());
    return finish(2);
  }
  const auto after = distckpt::bench::proc_status();
  auto grown = [&](const char* key) {
    return after.count(key) && before.count(key) && after.at(key) > before.at(key) ? after.at(key) - before.at(key)
                                                                                    : uint64_t{0};
  };
  const uint64_t peak = after.count("VmHWM") ? after.at("VmHWM") : 0;
  const uint64_t at_reset = before.count("VmRSS") ? before.at("VmRSS") : 0;
  const uint64_t not_anon = grown("RssFile") + grown("RssShmem");
  const uint64_t extra = peak > at_reset + not_anon ? peak - at_reset - not_anon : 0;
  const uint64_t allowed = bound.bytes + 8 * index_bytes + kSlack;
  const bool over = extra > allowed;
  // Rank by rank, in order, so that the log reads as a table.
  for (int r = 0; r < world; ++r) {
    if (r == rank)
      std::printf("%s: rank %d: extra %.1f MiB (peak %.1f MiB, at reset %.1f MiB, file/shm growth %.1f MiB), "
                  "state %.1f MiB, bound %.1f MiB = %s [%.1f MiB] + 8 x index [%.2f MiB] + slack 16 MiB%s\n",
                  op.c_str(), rank, extra / 1048576.0, peak / 1048576.0, at_reset / 1048576.0, not_anon / 1048576.0,
                  state.bytes / 1048576.0, allowed / 1048576.0, bound.text.c_str(), bound.bytes / 1048576.0,
                  8.0 * index_bytes / 1048576.0, over ? "  OVER THE BOUND" : "");
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  int bad = over ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  async.reset();
  if (rank == 0) {
    (void)distckpt::posix_filesystem()->remove_all(dir);
    std::printf(bad ? "memory_bound %s: FAILED\n" : "memory_bound %s: within the bound\n", op.c_str());
  }
  return finish(bad);
}
