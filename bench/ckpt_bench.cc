// ckpt_bench: times distckpt::save and distckpt::load of the benchmark workload
// (/work/shared/bench/WORKLOAD.md) on DP x TP MPI ranks, then verifies every loaded
// element.
//
//   mpirun -np 4 ckpt_bench --size 1G --dp 2 --tp 2 --dir /dev/shm/ck --json
//   mpirun -np 4 ckpt_bench --size 1G --dp 2 --tp 2 --dir /var/tmp/ck --repeat 5 --compare-dd
//   mpirun -np 4 ckpt_bench --size 1G --dp 2 --tp 2 --dir /var/tmp/ck --repeat 5 --async
//
// --repeat N runs save+load N times in one process and reports medians (these shared
// machines are noisy); --compare-dd times, in the same run and directory, a dd-like
// write+fsync and read of the same bytes and reports save_vs_dd / load_vs_dd; --async
// saves with AsyncCheckpointer and reports blocking_s (the caller blocked), save_s (until
// committed) and a memcpy of the rank's bytes as the reference for blocking_s.
//
// Each rank generates its slices once, before any timing (allocation and first touch of
// the state buffers are excluded from every figure). A timed phase starts after a
// barrier and its time is the maximum over ranks.
//
//   ckpt_bench --simulate-ranks 16384 --tensors 2000     (planning only: no MPI, no data)
//
// --simulate-ranks N plans, in one process, the save of a transformer-like model by N
// simulated ranks (DP x TP8 x PP16 by default) and its load onto DP x TP4 x PP8, with the
// library's own planner, and reports plan times and the index size.
//
// Exit status (identical on all ranks): 0 success, 1 a distckpt error, 2 bad arguments
// (including a world size other than dp*tp), 3 loaded data differs from the workload.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "plan/simulate.h"  // internal: the planner, for --simulate-ranks
#include "base/bounce.h"  // internal: whether buffered I/O bounces, reported
#include "storage/memory_fs.h"  // internal: tmpfs or ramfs, for --compare-limit
#include "storage/object_fs.h"  // internal: the file system of s3:// roots
#include "storage/s3_config.h"  // internal: is_object_path
#include "storage_limits.h"
#include "proc_status.h"
#include "quiet_mpi.h"
#include "workload.h"

namespace {

using distckpt::Box;
using distckpt::Status;
using distckpt::bench::median;
using distckpt::bench::quiet_allreduce;
using distckpt::bench::quiet_barrier;
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
  int repeat = 1;
  bool compare_dd = false;
  bool no_checksum = false;
  bool allow_unchecked = false;
  bool async = false;
  std::string staging = "1G";
  std::string replica_reads = "auto";
  bool buffered_reads = false;  // LoadOptions::direct_reads off
  std::string format = "native";
  bool integrated = false;
  std::string enc_key_file, enc_key_env, enc_mode = "AES-GCM";
  std::shared_ptr<const distckpt::EncryptionKey> key;  // loaded from enc_key_file / enc_key_env
  // The node-local tier (tier.h): local saves to this directory, restores from it.
  std::string local_dir, redundancy = "auto";
  bool drain = false;
  bool no_recycle = false;
  int lose_node = -1;  // before restoring: this node's local files are wiped (a replaced host)
  // The peer harness's record (shared/bench/WORKLOAD.md), written by rank 0, and cold
  // loads as the peers measure them.
  std::string peers_json;
  bool drop_cache = false;
  // Small pieces (under 4 KiB) of a reshard: read by data sieving instead of exactly;
  // or both, one after the other in each repeat, to compare them.
  bool sieve = false, compare_sieve = false;
  bool compare_limit = false;  // fio in the same run and directory (fio_limit)
  // Where each slice's buffer starts, modulo 64: 0 as PyTorch's CPU allocator and XLA
  // place tensors (64-byte aligned), 16 as glibc's malloc places a large block.
  int buffer_offset = 0;
  // Incremental saves (SaveOptions::incremental): between saves this fraction of the
  // state's bytes changes (whole tensors, the first ones of the list); < 0: off.
  double change_fraction = -1;
};

// Where the checkpoint of `a` lives: a directory, or a single file with its extension.
std::string checkpoint_path(const Args& a) {
  static const std::map<std::string, std::string> ext = {{"ckpt", ".ckpt"}, {"safetensors", ".safetensors"}, {"hdf5", ".h5"}};
  auto it = ext.find(a.format);
  return a.dir + "/" + a.name + (it == ext.end() ? "" : it->second);
}

// Peak resident memory of this process, bytes (Linux reports ru_maxrss in KiB).
uint64_t peak_rss_bytes() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

struct SliceFree {
  std::size_t offset = 0;
  void operator()(float* p) const { std::free(reinterpret_cast<char*>(p) - offset); }
};

// One tensor's slice on this rank: the box it holds and a buffer owned by the bench.
struct Slice {
  const WorkloadTensor* tensor = nullptr;
  Box box;
  size_t elements = 0;
  // At least one element, so empty boxes get a pointer; `buffer_offset` bytes past a
  // 64-byte boundary.
  std::unique_ptr<float[], SliceFree> data;
};

std::unique_ptr<float[], SliceFree> slice_buffer(std::size_t elements, int offset) {
  const std::size_t bytes = (std::max<std::size_t>(elements, 1) * sizeof(float) + offset + 63) / 64 * 64;
  char* block = static_cast<char*>(std::aligned_alloc(64, bytes));
  if (block == nullptr) throw std::bad_alloc();
  return std::unique_ptr<float[], SliceFree>(reinterpret_cast<float*>(block + offset),
                                             SliceFree{static_cast<std::size_t>(offset)});
}

// Collective: true when `ok` holds on every rank. Used for local steps (argument checks,
// setup, cleanup on rank 0) so that no rank is left waiting in a later collective.
bool all_ok(bool ok) {
  int all = ok ? 1 : 0;
  quiet_allreduce(&all, 1, MPI_INT, MPI_MIN);
  return all == 1;
}

// Collective: max over ranks of this rank's elapsed seconds.
double max_over_ranks(double seconds) { return distckpt::bench::quiet_max(seconds); }

std::string human_bytes(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

// Metadata sizes: KiB or MiB.
std::string metadata_bytes(uint64_t bytes) {
  char buf[64];
  if (bytes < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
  else std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1u << 20));
  return buf;
}

// This rank's part of the workload, with the buffers the state dict points into.
struct Workload {
  std::vector<WorkloadTensor> tensors;
  std::vector<Slice> slices;
  distckpt::StateDict state;
  uint64_t rank_bytes = 0;
  explicit Workload(int rank) : state(rank) {}
};

// Generates this rank's slices (allocation and first touch happen here, untimed).
Status generate(const Args& a, int rank, Workload& w) {
  w.slices.reserve(w.tensors.size());
  for (const WorkloadTensor& t : w.tensors) {
    auto layout = distckpt::bench::workload_layout(t, a.dp, a.tp);
    if (!layout.ok()) return layout.status();
    std::vector<Box> boxes = layout->boxes_of(rank);
    if (boxes.size() != 1)
      return distckpt::internal_error("ckpt_bench: rank " + std::to_string(rank) + ": tensor '" + t.name +
                                      "': layout gives " + std::to_string(boxes.size()) + " boxes, expected 1");
    Slice s;
    s.tensor = &t;
    s.box = std::move(boxes[0]);
    s.elements = static_cast<size_t>(s.box.num_elements());
    s.data = slice_buffer(s.elements, a.buffer_offset);
    distckpt::bench::fill_slice(a.seed, t, s.box, s.data.get());
    w.rank_bytes += s.elements * sizeof(float);
    DISTCKPT_RETURN_IF_ERROR(w.state.add_tensor(t.name, distckpt::DType::kFloat32, s.data.get(), *layout));
    w.slices.push_back(std::move(s));
  }
  return Status();
}

// Collective: rank 0 removes `path` if it exists, and commits the delete (settle_deletes).
bool remove_checkpoint(const std::string& path, bool root) {
  Status removed;
  if (root) {
    auto fs = distckpt::internal_storage::filesystem_for(path, nullptr);  // s3:// roots too
    if (fs->exists(path)) {
      removed = fs->remove_all(path);
      if (removed.ok()) distckpt::bench::settle_deletes(path);
    }
    if (!removed.ok()) std::cerr << "ckpt_bench: removing " << path << ": " << removed.to_string() << "\n";
  }
  return all_ok(removed.ok());
}

// The median of each repeat's limit / our time: each pair ran minutes apart at most, so
// a drift of the machine between repeats moves both sides of a ratio alike.
double paired_ratio(const std::vector<double>& limit, const std::vector<double>& ours) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < limit.size() && i < ours.size(); ++i)
    if (ours[i] > 0) ratios.push_back(limit[i] / ours[i]);
  return median(ratios);
}

struct Runs {
  std::vector<double> save, load, dd_write, dd_read, plan, write, commit;
  std::vector<double> limit_write, limit_read;  // --compare-limit (fio)
  // --compare-limit on a memory file system with replicas: fio's read of every rank's
  // state (limit_read counts the unique bytes once).
  std::vector<double> limit_read_needed;
  distckpt::bench::FioLimit limit_jobs, needed_jobs;  // the last repeat's job files
  uint64_t bytes_landed = 0;  // the state of all ranks: what a load lands in memory
  std::vector<double> load_read, load_exchange;  // where a load's time goes (max over ranks)
  std::vector<double> blocking, memcpy_s;  // --async
  std::optional<distckpt::SaveResult> saved;
  std::optional<distckpt::LoadResult> loaded;
  std::vector<double> load_sieve;  // --compare-sieve: the same load with sieving
  std::optional<distckpt::LoadResult> loaded_sieve;
  uint64_t mismatches = 0;
  // Peak resident memory (max over ranks) and the most state bytes a rank holds: the
  // difference is what saving and loading cost in memory beyond the state itself.
  uint64_t peak_rss = 0, rank_state_max = 0;
  // VmHWM minus the resident set once the state was generated (peak reset there): the
  // operations' own memory, max over ranks (includes MPI's shared segments they touch).
  uint64_t peak_extra = 0;
};

// The reference for an async save's blocking time: a memcpy of every byte this rank
// holds into a buffer touched beforehand (max over ranks).
double memcpy_reference(const Workload& w) {
  std::vector<char> dst(w.rank_bytes);
  std::memset(dst.data(), 1, dst.size());
  distckpt::bench::timed_phase_barrier();
  const double t0 = MPI_Wtime();
  std::size_t at = 0;
  for (const Slice& s : w.slices) {
    std::memcpy(dst.data() + at, s.data.get(), s.elements * sizeof(float));
    at += s.elements * sizeof(float);
  }
  return max_over_ranks(MPI_Wtime() - t0);
}

// Collective: the checkpoint's files dropped from the page cache before a timed load, as
// the peers do: fadvise(DONTNEED) on every file (evict_cached), then
// /proc/sys/vm/drop_caches where permitted, by one rank per node. Returns how: "fadvise"
// or "fadvise+drop_caches" (the same on every node that could).
std::string drop_page_cache(const std::string& path, MPI_Comm node_comm) {
  int node_rank = 0;
  MPI_Comm_rank(node_comm, &node_rank);
  int dropped = 1;
  if (node_rank == 0) {
    auto fs = distckpt::posix_filesystem();
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) (void)fs->evict_cached(it->path().string());
    } else {
      (void)fs->evict_cached(path);
    }
    ::sync();
    std::ofstream drop("/proc/sys/vm/drop_caches");
    drop << "1\n";
    drop.flush();
    dropped = drop.good() ? 1 : 0;
  }
  quiet_allreduce(&dropped, 1, MPI_INT, MPI_MIN);
  return dropped == 1 ? "fadvise+drop_caches" : "fadvise";
}

// Bytes of every file under `path` (a directory) or of the file `path`.
uint64_t bytes_on_disk(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return std::filesystem::file_size(path, ec);
  uint64_t total = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

// One timed save (collective). Returns false after printing the error. With --async,
// also records how long the caller was blocked (save_async) before the wait.
bool timed_save(const Args& a, Workload& w, distckpt::Comm& comm, distckpt::AsyncCheckpointer* async, bool root,
                Runs& runs) {
  if (a.mode == "both" && !remove_checkpoint(checkpoint_path(a), root)) return false;
  distckpt::SaveOptions opts;
  opts.name = a.name;
  opts.step = 0;
  opts.format = *distckpt::format_from_name(a.format);
  if (a.integrated) opts.integrated = true;
  opts.checksum = !a.no_checksum;
  if (a.key) opts.encryption = {*distckpt::encryption_mode_from_name(a.enc_mode), a.key};
  // In mode both the checkpoint is removed at the end: do not leave `latest` dangling.
  opts.update_latest = a.mode != "both";
  distckpt::bench::timed_phase_barrier();
  const double t0 = MPI_Wtime();
  distckpt::Result<distckpt::SaveResult> r = distckpt::internal_error("not run");
  if (async != nullptr) {
    Status started = async->save_async(w.state, a.dir, opts);
    runs.blocking.push_back(max_over_ranks(MPI_Wtime() - t0));
    r = started.ok() ? async->wait() : distckpt::Result<distckpt::SaveResult>(started);
  } else {
    r = distckpt::save(comm, w.state, a.dir, opts);
  }
  runs.save.push_back(max_over_ranks(MPI_Wtime() - t0));
  if (!r.ok()) {  // identical on every rank
    if (root) std::cerr << "ckpt_bench: save: " << r.status().to_string() << "\n";
    return false;
  }
  runs.plan.push_back(max_over_ranks(r->plan_s));
  runs.write.push_back(max_over_ranks(r->write_s));
  runs.commit.push_back(max_over_ranks(r->commit_s));
  runs.saved = std::move(r).value();
  return true;
}

// One timed load into zeroed buffers, then verification of every element (collective).
// `sieve`: read small pieces by data sieving (--sieve, or the second load of
// --compare-sieve, whose figures go to load_sieve / loaded_sieve).
bool timed_load(const Args& a, Workload& w, distckpt::Comm& comm, bool root, Runs& runs, bool sieve,
                bool second = false) {
  for (Slice& s : w.slices) std::memset(s.data.get(), 0, s.elements * sizeof(float));
  distckpt::bench::timed_phase_barrier();
  const double t0 = MPI_Wtime();
  distckpt::LoadOptions opts;
  opts.replica_reads = a.replica_reads == "shared" ? distckpt::LoadOptions::ReplicaReads::kShared
                      : a.replica_reads == "each" ? distckpt::LoadOptions::ReplicaReads::kEach
                                                  : distckpt::LoadOptions::ReplicaReads::kAuto;
  opts.key = a.key;
  opts.allow_unchecked = a.allow_unchecked;
  opts.sieve_small_runs = sieve;
  opts.direct_reads = !a.buffered_reads;
  auto r = distckpt::load(comm, w.state, checkpoint_path(a), opts);
  (second ? runs.load_sieve : runs.load).push_back(max_over_ranks(MPI_Wtime() - t0));
  if (!r.ok()) {
    if (root) std::cerr << "ckpt_bench: load: " << r.status().to_string() << "\n";
    return false;
  }
  if (second) {
    runs.loaded_sieve = std::move(r).value();
  } else {
    runs.load_read.push_back(max_over_ranks(r->read_s));
    runs.load_exchange.push_back(max_over_ranks(r->exchange_s));
    runs.loaded = std::move(r).value();
  }
  uint64_t all = 0;
  for (const Slice& s : w.slices) all += distckpt::bench::check_slice(a.seed, *s.tensor, s.box, s.data.get());
  quiet_allreduce(&all, 1, MPI_UINT64_T, MPI_SUM);
  runs.mismatches += all;
  return true;
}

void report(const Args& a, const Workload& w, const Runs& runs, uint64_t size, int world, int nodes, double gen_s,
            const std::string& cache_dropped) {
  const bool do_save = !runs.save.empty(), do_load = !runs.load.empty();
  const uint64_t bytes_unique = runs.saved ? runs.saved->bytes_unique : distckpt::bench::workload_bytes(w.tensors);
  auto gbps = [bytes_unique](double s) { return s > 0 ? bytes_unique / 1e9 / s : 0.0; };
  using json = nlohmann::ordered_json;  // keys in the documented order
  auto opt = [](bool have, double v) { return have ? json(v) : json(nullptr); };
  const double save_s = median(runs.save), load_s = median(runs.load);
  const double dd_w = median(runs.dd_write), dd_r = median(runs.dd_read);
  const bool dd = !runs.dd_write.empty();
  const bool verified = do_load && runs.mismatches == 0;
  if (a.json) {
    json j;
    j["size"] = size;
    j["ranks"] = world;
    j["nodes"] = nodes;
    j["dp"] = a.dp;
    j["tp"] = a.tp;
    j["dir"] = a.dir;
    j["mode"] = a.mode;
    j["replica_reads"] = a.replica_reads;
    j["format"] = a.format;
    j["integrated"] = a.integrated || a.format == "ckpt" || a.format == "safetensors";
    j["checksum"] = !a.no_checksum;
    j["encryption"] = a.key ? a.enc_mode : std::string("none");
    j["tensors"] = w.tensors.size();
    j["save_s"] = opt(do_save, save_s);
    j["load_s"] = opt(do_load, load_s);
    j["bytes_unique"] = bytes_unique;
    j["bytes_written"] = runs.saved ? json(runs.saved->bytes_written) : json(nullptr);
    j["bytes_read"] = runs.loaded ? json(runs.loaded->bytes_read) : json(nullptr);
    j["bytes_needed"] = runs.loaded ? json(runs.loaded->bytes_needed) : json(nullptr);
    // The load reads from --dir (the shared file system on a cluster): every byte read
    // is read from it. Bytes sent between ranks of different nodes: shared replica reads.
    j["bytes_read_shared"] = runs.loaded ? json(runs.loaded->bytes_read) : json(nullptr);
    j["bytes_between_hosts"] = runs.loaded ? json(runs.loaded->bytes_between_hosts) : json(nullptr);
    j["read_amplification"] = runs.loaded && runs.loaded->bytes_needed > 0
                                  ? json(static_cast<double>(runs.loaded->bytes_read) /
                                         static_cast<double>(runs.loaded->bytes_needed))
                                  : json(nullptr);
    j["bytes_read_direct"] = runs.loaded ? json(runs.loaded->bytes_read_direct) : json(nullptr);
    j["small_reads"] = runs.loaded ? json(runs.loaded->small_reads) : json(nullptr);
    j["small_runs"] = runs.loaded ? json(runs.loaded->small_runs) : json(nullptr);
    if (runs.loaded_sieve) {
      j["sieve_load_s"] = median(runs.load_sieve);
      j["sieve_bytes_read"] = runs.loaded_sieve->bytes_read;
      j["load_vs_sieve"] = median(runs.load) / std::max(1e-9, median(runs.load_sieve));
      j["sieve_load_runs_s"] = runs.load_sieve;
    }
    j["save_gbps"] = opt(do_save, gbps(save_s));
    j["load_gbps"] = opt(do_load, gbps(load_s));
    // Where a save's time goes: each phase's maximum over ranks (median over runs).
    j["save_plan_s"] = opt(do_save, median(runs.plan));
    j["save_write_s"] = opt(do_save, median(runs.write));
    j["save_commit_s"] = opt(do_save, median(runs.commit));
    j["load_read_s"] = opt(do_load, median(runs.load_read));
    j["load_exchange_s"] = opt(do_load, median(runs.load_exchange));
    j["verified"] = do_load ? json(verified) : json(nullptr);
    j["mismatches"] = do_load ? json(runs.mismatches) : json(nullptr);
    j["runs"] = std::max(runs.save.size(), runs.load.size());
    j["save_runs_s"] = runs.save;
    j["load_runs_s"] = runs.load;
    if (!runs.blocking.empty()) {
      j["blocking_s"] = median(runs.blocking);
      j["memcpy_s"] = median(runs.memcpy_s);
      j["blocking_vs_memcpy"] = median(runs.blocking) / std::max(1e-9, median(runs.memcpy_s));
      j["blocking_runs_s"] = runs.blocking;
    }
    if (dd) {
      j["dd_write_s"] = dd_w;
      j["dd_read_s"] = dd_r;
      j["save_vs_dd"] = opt(do_save, save_s > 0 ? dd_w / save_s : 0);
      j["load_vs_dd"] = opt(do_load, load_s > 0 ? dd_r / load_s : 0);
    }
    if (!runs.limit_write.empty()) {
      const double lw = median(runs.limit_write), lr = median(runs.limit_read);
      j["limit_write_s"] = lw;
      j["limit_read_s"] = lr;
      j["save_vs_limit"] = opt(do_save, save_s > 0 ? lw / save_s : 0);
      j["load_vs_limit"] = opt(do_load, load_s > 0 ? lr / load_s : 0);
      j["save_vs_limit_paired"] = opt(do_save, paired_ratio(runs.limit_write, runs.save));
      j["load_vs_limit_paired"] = opt(do_load, paired_ratio(runs.limit_read, runs.load));
      j["limit_write_runs_s"] = runs.limit_write;
      j["limit_read_runs_s"] = runs.limit_read;
      if (!runs.limit_read_needed.empty()) {
        j["bytes_landed"] = runs.bytes_landed;
        j["limit_read_needed_s"] = median(runs.limit_read_needed);
        j["load_vs_needed_read"] = opt(do_load, load_s > 0 ? median(runs.limit_read_needed) / load_s : 0);
        j["limit_read_needed_runs_s"] = runs.limit_read_needed;
      }
      // How the limit ran: fio's CPUs (the other ranks slept meanwhile), and its job files.
      j["limit_cpus"] = runs.limit_jobs.cpus;
      json jobs{{"write", runs.limit_jobs.write_job}, {"read", runs.limit_jobs.read_job}};
      if (!runs.limit_read_needed.empty()) {
        jobs["needed_write"] = runs.needed_jobs.write_job;
        jobs["needed_read"] = runs.needed_jobs.read_job;
      }
      j["limit_jobs"] = jobs;
    }
    j["cache_dropped"] = cache_dropped;  // before each timed load: no, fadvise, fadvise+drop_caches
    j["bounce_io"] = distckpt::internal_base::bounce_io();
    j["peak_rss_bytes"] = runs.peak_rss;
    j["rank_state_bytes_max"] = runs.rank_state_max;
    j["peak_extra_bytes"] = runs.peak_extra;
    j["timing_note"] = kTimingNote;
    std::cout << j.dump() << std::endl;
    return;
  }
  std::printf("ckpt_bench: %zu tensors, %s unique (%llu bytes), %d ranks (dp=%d x tp=%d), %s\n", w.tensors.size(),
              human_bytes(bytes_unique).c_str(), static_cast<unsigned long long>(bytes_unique), world, a.dp, a.tp,
              (checkpoint_path(a) + " (" + a.format + (a.integrated ? ", integrated" : "") +
               (a.no_checksum ? ", no checksum" : "") + (a.key ? ", " + a.enc_mode : std::string()) + ")")
                  .c_str());
  std::printf("setup: rank 0 holds %s, generated in %.3f s (not timed below)\n", human_bytes(w.rank_bytes).c_str(),
              gen_s);
  if (do_save)
    std::printf("save: %.3f s  %.3f GB/s  bytes_written %llu  (plan %.3f, write %.3f, commit %.3f s)\n", save_s,
                gbps(save_s), static_cast<unsigned long long>(runs.saved->bytes_written), median(runs.plan),
                median(runs.write), median(runs.commit));
  if (do_load)
    std::printf("load: %.3f s  %.3f GB/s  bytes_read %llu  bytes_needed %llu  (read %.3f, exchange %.3f s)  %s (%llu "
                "mismatches)\n",
                load_s, gbps(load_s), static_cast<unsigned long long>(runs.loaded->bytes_read),
                static_cast<unsigned long long>(runs.loaded->bytes_needed), median(runs.load_read),
                median(runs.load_exchange), verified ? "verified" : "VERIFICATION FAILED",
                static_cast<unsigned long long>(runs.mismatches));
  if (do_load && !runs.loaded->small_reads.empty())
    std::printf("small pieces (< 4 KiB): %llu, read by %s\n", static_cast<unsigned long long>(runs.loaded->small_runs),
                runs.loaded->small_reads.c_str());
  if (runs.loaded_sieve)
    std::printf("with data sieving: load %.3f s, bytes_read %llu  ->  load_vs_sieve %.3f (%s / sieving)\n",
                median(runs.load_sieve), static_cast<unsigned long long>(runs.loaded_sieve->bytes_read),
                median(runs.load) / std::max(1e-9, median(runs.load_sieve)),
                runs.loaded->small_reads.empty() ? "exact" : runs.loaded->small_reads.c_str());
  if (do_load)
    std::printf("load across %d node(s): bytes_read_shared %llu  bytes_between_hosts %llu  (replica reads: %s); "
                "read directly %llu (%s)\n",
                nodes, static_cast<unsigned long long>(runs.loaded->bytes_read),
                static_cast<unsigned long long>(runs.loaded->bytes_between_hosts), a.replica_reads.c_str(),
                static_cast<unsigned long long>(runs.loaded->bytes_read_direct),
                a.buffered_reads ? "--buffered-reads" : "O_DIRECT where the file system allows it");
  if (!runs.blocking.empty())
    std::printf("async: caller blocked %.3f s (memcpy of the rank's bytes: %.3f s, ratio %.2f); committed after %.3f s\n",
                median(runs.blocking), median(runs.memcpy_s),
                median(runs.blocking) / std::max(1e-9, median(runs.memcpy_s)), save_s);
  if (dd)
    std::printf("dd reference: write+fsync %.3f s, read %.3f s  ->  save_vs_dd %.2f  load_vs_dd %.2f\n", dd_w, dd_r,
                do_save && save_s > 0 ? dd_w / save_s : 0.0, do_load && load_s > 0 ? dd_r / load_s : 0.0);
  if (!runs.limit_write.empty()) {
    const double lw = median(runs.limit_write), lr = median(runs.limit_read);
    if (runs.limit_jobs.tool == "curl")
      std::printf("curl limit (one PUT per rank of its share, streamed from memory; each object read back once): ");
    else
      std::printf("fio limit (one job per rank into new files, 8 MiB blocks, direct where allowed, end fsync; cold read "
                  "of the unique bytes once): ");
    std::printf("write %.3f s, read %.3f s  ->  save_vs_limit %.2f  load_vs_limit %.2f\n", lw, lr, do_save && save_s > 0 ? lw / save_s : 0.0, do_load && load_s > 0 ? lr / load_s : 0.0);
    // Each repeat's pair: on a shared disk the limit itself drifts between repeats, and the
    // pairs show whether a median ratio is the save's or the disk's.
    if (do_save) {
      std::printf("per repeat, %s write / save:", runs.limit_jobs.tool.c_str());
      for (std::size_t i = 0; i < runs.limit_write.size() && i < runs.save.size(); ++i)
        std::printf("  %.3f/%.3f", runs.limit_write[i], runs.save[i]);
      std::printf("%s\n", a.keep ? "  (--keep: the last fio write ran beside the kept checkpoint)" : "");
    }
    if (do_load) {
      std::printf("per repeat, %s read / load:", runs.limit_jobs.tool.c_str());
      for (std::size_t i = 0; i < runs.limit_read.size() && i < runs.load.size(); ++i)
        std::printf("  %.3f/%.3f", runs.limit_read[i], runs.load[i]);
      std::printf("\n");
    }
    if (runs.limit_jobs.tool == "fio")
      std::printf("fio ran on %d CPU(s) while the other ranks slept; its job files: --json (limit_jobs)\n",
                  runs.limit_jobs.cpus);
    std::printf("median of the per-repeat ratios: save_vs_limit_paired %.2f  load_vs_limit_paired %.2f\n",
                do_save ? paired_ratio(runs.limit_write, runs.save) : 0.0,
                do_load ? paired_ratio(runs.limit_read, runs.load) : 0.0);
    if (!runs.limit_read_needed.empty())
      std::printf("fio read of what the load lands (every rank's state, %.3f GB, one job per rank): %.3f s  ->  "
                  "load_vs_needed_read %.2f\n",
                  static_cast<double>(runs.bytes_landed) / 1e9, median(runs.limit_read_needed),
                  load_s > 0 ? median(runs.limit_read_needed) / load_s : 0.0);
  }
  // The first repeat is this process's first save and load: a restore is always a
  // process's first load, and it pays what later repeats no longer do (fresh memory the
  // kernel has not touched yet: base/bounce.h), which the medians hide.
  if ((do_save || do_load) && (runs.save.size() > 1 || runs.load.size() > 1)) {
    std::printf("first repeat (this process's first):");
    if (do_save) std::printf("  save %.3f s", runs.save.front());
    if (do_load) std::printf("  load %.3f s", runs.load.front());
    std::printf("\n");
  }
  const bool bounce = distckpt::internal_base::bounce_io();
  std::printf("buffered file I/O: %s (%s)\n",
              bounce ? "through a bounce buffer per thread" : "straight into and out of the tensors",
              distckpt::internal_base::bounce_io_from_env().has_value()
                  ? (bounce ? "DISTCKPT_BOUNCE=1" : "DISTCKPT_BOUNCE=0")
                  : (bounce ? "the kernel's first touch of a page traps here" : "the kernel's first touch of a page is cheap here"));
  std::printf("memory: peak resident %s on the largest rank, which holds at most %s of state; peak extra "
              "(VmHWM over the resident set after generation) %.1f MiB\n",
              human_bytes(runs.peak_rss).c_str(), human_bytes(runs.rank_state_max).c_str(),
              static_cast<double>(runs.peak_extra) / (1 << 20));
  std::printf("medians of %zu run(s); timings exclude generation and first touch; each is the max over ranks\n",
              std::max(runs.save.size(), runs.load.size()));
  if (a.drop_cache) std::printf("loads were cold: page cache dropped before each (%s)\n", cache_dropped.c_str());
  std::fflush(stdout);
}

// ---- the node-local tier (--local-dir) ----

// Collective: the files of the global checkpoint `dir`/`name` dropped from the page
// cache (rank 0), so that a restore from the global tier reads storage, as after a
// host loss on a cluster where the shared file system is not this host's cache.
void evict_global(const std::string& path, bool root) {
  if (root) {
    auto fs = distckpt::posix_filesystem();
    auto entries = fs->list_dir(path);
    if (entries.ok())
      for (const auto& e : *entries)
        if (!e.is_dir) (void)fs->evict_cached(path + "/" + e.name);
  }
  quiet_barrier();
}

// Collective: removes what a tier run left: the record, every node's local files, the
// global copy.
// As a training loop's retention does: the local checkpoint through remove_local (its
// files kept as the next save's spares unless --no-recycle), the drained copy by hand.
void remove_tier_checkpoint(const Args& a, const std::string& name, distckpt::Comm& comm, bool root) {
  auto fs = distckpt::posix_filesystem();
  if (root) (void)fs->remove_all(a.dir + "/" + name);
  (void)distckpt::remove_local(comm, a.dir, {a.local_dir, a.redundancy, !a.no_recycle}, name);
  quiet_barrier();
}

int run_tier_bench(const Args& a, Workload& w, distckpt::Comm& comm, distckpt::AsyncCheckpointer* async, bool root,
                   uint64_t size, int world) {
  using json = nlohmann::ordered_json;
  std::vector<double> blocking_s;  // --async: how long the caller was blocked
  const uint64_t bytes_unique = distckpt::bench::workload_bytes(w.tensors);
  std::vector<double> memcpy_s, local_s, drain_s, restore_local_s, restore_global_s, redundancy_s;
  distckpt::LocalSaveResult last_save;
  distckpt::RestoreSources local_sources, global_sources;
  uint64_t mismatches = 0;
  const distckpt::LocalTier tier{a.local_dir, a.redundancy, !a.no_recycle};
  auto verify = [&] {
    uint64_t all = 0;
    for (const Slice& s : w.slices) all += distckpt::bench::check_slice(a.seed, *s.tensor, s.box, s.data.get());
    quiet_allreduce(&all, 1, MPI_UINT64_T, MPI_SUM);
    mismatches += all;
  };
  auto fail = [&](const char* what, const distckpt::Status& st) {
    if (root) std::cerr << "ckpt_bench: " << what << ": " << st.to_string() << "\n";
    return kExitError;
  };
  for (int i = 0; i < a.repeat; ++i) {
    const std::string name = a.name + "-tier" + std::to_string(i);
    remove_tier_checkpoint(a, name, comm, root);
    memcpy_s.push_back(memcpy_reference(w));
    distckpt::SaveOptions opts;
    opts.name = name;
    opts.step = i;
    if (a.key) opts.encryption = {*distckpt::encryption_mode_from_name(a.enc_mode), a.key};
    distckpt::bench::timed_phase_barrier();
    double t0 = MPI_Wtime();
    distckpt::Result<distckpt::LocalSaveResult> saved = distckpt::internal_error("not run");
    if (async != nullptr) {
      distckpt::Status started = async->save_local_async(w.state, a.dir, opts, tier);
      blocking_s.push_back(max_over_ranks(MPI_Wtime() - t0));
      saved = started.ok() ? async->wait_local() : distckpt::Result<distckpt::LocalSaveResult>(started);
    } else {
      saved = distckpt::save_local(comm, w.state, a.dir, opts, tier);
    }
    local_s.push_back(max_over_ranks(MPI_Wtime() - t0));
    if (!saved.ok()) return fail("local save", saved.status());
    last_save = *saved;
    redundancy_s.push_back(max_over_ranks(saved->redundancy_s));
    if (a.drain) {
      distckpt::bench::timed_phase_barrier();
      t0 = MPI_Wtime();
      auto drained = distckpt::drain(comm, a.dir, tier, name, opts);
      drain_s.push_back(max_over_ranks(MPI_Wtime() - t0));
      if (!drained.ok()) return fail("drain", drained.status());
    }
    if (a.lose_node >= 0) {
      // A host lost and replaced: its node-local files and its node id are gone.
      std::string local = a.local_dir;
      for (auto at = local.find("{host}"); at != std::string::npos; at = local.find("{host}"))
        local.replace(at, 6, comm.node_name(comm.rank()));
      if (comm.node_of(comm.rank()) == a.lose_node) {
        (void)distckpt::posix_filesystem()->remove_all(local + "/" + name);
        (void)distckpt::posix_filesystem()->remove_file(local + "/.distckpt-node");
      }
      quiet_barrier();
    }
    if (a.mode != "save") {
      distckpt::RestoreOptions ro;
      ro.name = name;
      ro.fall_back = false;
      ro.load.key = a.key;
      for (Slice& s : w.slices) std::memset(s.data.get(), 0, s.elements * sizeof(float));
      distckpt::bench::timed_phase_barrier();
      t0 = MPI_Wtime();
      auto restored = distckpt::restore(comm, w.state, a.dir, tier, ro);
      restore_local_s.push_back(max_over_ranks(MPI_Wtime() - t0));
      if (!restored.ok()) return fail("restore", restored.status());
      local_sources = restored->sources;
      verify();
      if (a.drain) {
        evict_global(a.dir + "/" + name, root);
        ro.global_only = true;
        for (Slice& s : w.slices) std::memset(s.data.get(), 0, s.elements * sizeof(float));
        distckpt::bench::timed_phase_barrier();
        t0 = MPI_Wtime();
        restored = distckpt::restore(comm, w.state, a.dir, tier, ro);
        restore_global_s.push_back(max_over_ranks(MPI_Wtime() - t0));
        if (!restored.ok()) return fail("restore from the global tier", restored.status());
        global_sources = restored->sources;
        verify();
      }
    }
    if (!a.keep) remove_tier_checkpoint(a, name, comm, root);
  }
  if (!a.keep) distckpt::release_local_spares(comm, tier);
  // The read limits of both tiers, in this run: one file of the state's size each.
  std::string local_root = a.local_dir;
  for (auto at = local_root.find("{host}"); at != std::string::npos; at = local_root.find("{host}"))
    local_root.replace(at, 6, comm.node_name(comm.rank()));
  std::array<double, 2> dd_local{0, 0}, dd_global{0, 0};
  if (a.compare_dd) {
    dd_local = distckpt::bench::dd_reference(local_root, bytes_unique, root);
    dd_global = distckpt::bench::dd_reference(a.dir, bytes_unique, root);
    if (dd_local[0] < 0 || dd_global[0] < 0) return kExitError;
  }
  if (!root) return mismatches == 0 ? 0 : kExitMismatch;
  auto opt = [](bool have, double v) { return have ? json(v) : json(nullptr); };
  const double mem = median(memcpy_s), loc = median(local_s);
  const bool restored = !restore_local_s.empty(), global = !restore_global_s.empty();
  json j;
  j["size"] = size;
  j["ranks"] = world;
  j["nodes"] = comm.node_count();
  j["dp"] = a.dp;
  j["tp"] = a.tp;
  j["dir"] = a.dir;
  j["local_dir"] = a.local_dir;
  j["redundancy"] = a.redundancy;
  j["encryption"] = a.key ? a.enc_mode : std::string("none");
  j["bytes_unique"] = bytes_unique;
  j["memcpy_s"] = mem;
  j["local_save_s"] = loc;
  j["async"] = async != nullptr;
  j["blocking_s"] = opt(async != nullptr, median(blocking_s));
  j["blocking_vs_memcpy"] = opt(async != nullptr, median(blocking_s) / std::max(1e-9, mem));
  j["local_vs_memcpy"] = loc / std::max(1e-9, mem);
  j["redundancy_s"] = median(redundancy_s);
  j["local_plan_s"] = last_save.save.plan_s;  // the last run's, this rank's
  j["local_write_s"] = last_save.save.write_s;
  j["local_commit_s"] = last_save.save.commit_s;
  j["bytes_local"] = last_save.save.bytes_written;
  j["redundancy_bytes"] = last_save.redundancy_bytes;
  j["storage_ratio"] = last_save.storage_ratio;
  j["node_bytes_max"] = last_save.node_bytes_max;
  j["node_state_max"] = last_save.node_state_max;
  j["drain_s"] = opt(a.drain, median(drain_s));
  j["restore_local_s"] = opt(restored, median(restore_local_s));
  j["restore_global_s"] = opt(global, median(restore_global_s));
  j["recovery_ratio"] = opt(global && restored, median(restore_global_s) / std::max(1e-9, median(restore_local_s)));
  j["sources"] = {{"local", local_sources.local},
                  {"peer", local_sources.peer},
                  {"parity", local_sources.parity},
                  {"global", local_sources.global},
                  {"parity_read", local_sources.parity_read}};
  j["bytes_read_global"] = local_sources.global;
  j["lost_node"] = a.lose_node;
  if (a.compare_dd) {
    j["dd_read_local_s"] = dd_local[1];
    j["dd_read_global_s"] = dd_global[1];
    j["read_limit_ratio"] = dd_global[1] / std::max(1e-9, dd_local[1]);
  }
  j["verified"] = restored ? json(mismatches == 0) : json(nullptr);
  j["runs"] = a.repeat;
  j["timing_note"] = kTimingNote;
  if (a.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("ckpt_bench (local tier): %s unique, %d ranks on %d node(s), local %s (%s), global %s%s\n",
                human_bytes(bytes_unique).c_str(), world, comm.node_count(), a.local_dir.c_str(), a.redundancy.c_str(),
                a.dir.c_str(), a.lose_node >= 0 ? (", node " + std::to_string(a.lose_node) + " lost before the restore").c_str() : "");
    std::printf("local save: %.3f s = %.2f x memcpy (%.3f s); redundancy %s (%.3f s), storage per node %.2f x its state\n",
                loc, loc / std::max(1e-9, mem), mem, human_bytes(last_save.redundancy_bytes).c_str(),
                median(redundancy_s), last_save.storage_ratio);
    if (async != nullptr)
      std::printf("async: caller blocked %.3f s = %.2f x memcpy; committed after %.3f s\n", median(blocking_s),
                  median(blocking_s) / std::max(1e-9, mem), loc);
    if (a.drain) std::printf("drain: %.3f s\n", median(drain_s));
    if (restored)
      std::printf("restore from the local tier: %.3f s  sources: local=%llu peer=%llu parity=%llu global=%llu\n",
                  median(restore_local_s), static_cast<unsigned long long>(local_sources.local),
                  static_cast<unsigned long long>(local_sources.peer),
                  static_cast<unsigned long long>(local_sources.parity),
                  static_cast<unsigned long long>(local_sources.global));
    if (global)
      std::printf("restore from the global tier (evicted from the page cache): %.3f s  ->  recovery ratio %.2f\n",
                  median(restore_global_s), median(restore_global_s) / std::max(1e-9, median(restore_local_s)));
    if (a.compare_dd)
      std::printf("read limits: local %.3f s, global %.3f s  ->  ratio %.2f\n", dd_local[1], dd_global[1],
                  dd_global[1] / std::max(1e-9, dd_local[1]));
    std::printf("%s (%llu mismatches); medians of %d run(s)\n", mismatches == 0 ? "verified" : "VERIFICATION FAILED",
                static_cast<unsigned long long>(mismatches), a.repeat);
  }
  return mismatches == 0 ? 0 : kExitMismatch;
}

// --change-fraction F: incremental saves of a state of which F of the bytes change
// between saves (whole tensors, from the first), each timed beside a full save of the
// same state in the same repeat. Reports the bytes each writes (new bytes on storage)
// against the changed bytes and the checkpoint's logical size, and checks that the
// last incremental checkpoint loads back the state it was saved from.
int run_incremental_bench(const Args& a, Workload& w, distckpt::Comm& comm, distckpt::AsyncCheckpointer* async,
                          bool root, uint64_t size, int world) {
  const uint64_t total = distckpt::bench::workload_bytes(w.tensors);
  // The tensors that change: a prefix of the list holding F of the bytes (rounded up to
  // a whole tensor), the same on every rank.
  std::vector<bool> changes(w.tensors.size(), false);
  uint64_t changed = 0;
  for (std::size_t t = 0; t < w.tensors.size() && static_cast<double>(changed) < a.change_fraction * total; ++t) {
    changes[t] = true;
    changed += static_cast<uint64_t>(w.tensors[t].num_elements()) * sizeof(float);
  }
  auto save_as = [&](const std::string& name, bool incremental, const std::string& base,
                     double* seconds) -> distckpt::Result<distckpt::SaveResult> {
    distckpt::SaveOptions opts;
    opts.name = name;
    opts.incremental = incremental;
    opts.incremental_base = base;
    opts.update_latest = false;
    distckpt::bench::timed_phase_barrier();
    const double t0 = MPI_Wtime();
    distckpt::Result<distckpt::SaveResult> r = distckpt::internal_error("not run");
    if (async != nullptr) {
      Status started = async->save_async(w.state, a.dir, opts);
      r = started.ok() ? async->wait() : distckpt::Result<distckpt::SaveResult>(started);
    } else {
      r = distckpt::save(comm, w.state, a.dir, opts);
    }
    *seconds = max_over_ranks(MPI_Wtime() - t0);
    if (!r.ok() && root) std::cerr << "ckpt_bench: save '" << name << "': " << r.status().to_string() << "\n";
    return r;
  };
  std::vector<std::string> made;
  auto cleanup = [&] {
    for (auto it = made.rbegin(); it != made.rend(); ++it) remove_checkpoint(a.dir + "/" + *it, root);
  };
  double first_s = 0;
  auto first = save_as(a.name + "-inc-0", true, "", &first_s);
  if (!first.ok()) return kExitError;
  made.push_back(a.name + "-inc-0");
  std::vector<double> inc_s, full_s, written, referenced, index_bytes;
  std::string base = a.name + "-inc-0";
  for (int i = 1; i <= a.repeat; ++i) {
    for (std::size_t t = 0; t < w.slices.size(); ++t)
      if (changes[t])
        for (std::size_t e = 0; e < w.slices[t].elements; ++e) w.slices[t].data[e] += 1.0f;
    // Alternate which goes first: the page cache and the disk see both orders.
    double s_inc = 0, s_full = 0;
    const std::string inc_name = a.name + "-inc-" + std::to_string(i), full_name = a.name + "-full-" + std::to_string(i);
    distckpt::Result<distckpt::SaveResult> inc = distckpt::internal_error("not run"), full = inc;
    for (int order = 0; order < 2; ++order) {
      if ((order == 0) == (i % 2 == 1)) {
        inc = save_as(inc_name, true, base, &s_inc);
        if (!inc.ok()) return cleanup(), kExitError;
        made.push_back(inc_name);
      } else {
        full = save_as(full_name, false, "", &s_full);
        if (!full.ok()) return cleanup(), kExitError;
        if (!remove_checkpoint(a.dir + "/" + full_name, root)) return cleanup(), kExitError;
      }
    }
    inc_s.push_back(s_inc);
    full_s.push_back(s_full);
    written.push_back(static_cast<double>(inc->bytes_written));
    referenced.push_back(static_cast<double>(inc->bytes_referenced));
    index_bytes.push_back(static_cast<double>(inc->index_bytes));
    base = inc_name;
  }
  // The last incremental checkpoint holds the state as it is now.
  std::vector<std::vector<float>> expected;
  for (Slice& s : w.slices) {
    expected.emplace_back(s.data.get(), s.data.get() + s.elements);
    std::memset(s.data.get(), 0, s.elements * sizeof(float));
  }
  auto loaded = distckpt::load(comm, w.state, a.dir + "/" + base, {});
  uint64_t mismatches = 0;
  for (std::size_t t = 0; t < w.slices.size(); ++t)
    if (std::memcmp(expected[t].data(), w.slices[t].data.get(), w.slices[t].elements * sizeof(float)) != 0) ++mismatches;
  quiet_allreduce(&mismatches, 1, MPI_UINT64_T, MPI_SUM);
  if (!loaded.ok() && root) std::cerr << "ckpt_bench: load '" << base << "': " << loaded.status().to_string() << "\n";
  if (!a.keep) cleanup();
  if (!loaded.ok()) return kExitError;
  if (root) {
    const double wr = median(written), idx = median(index_bytes), inc = median(inc_s), full = median(full_s);
    nlohmann::ordered_json j;
    j["size"] = size;
    j["ranks"] = world;
    j["dp"] = a.dp;
    j["tp"] = a.tp;
    j["dir"] = a.dir;
    j["async"] = async != nullptr;
    j["change_fraction"] = a.change_fraction;
    j["bytes_unique"] = total;
    j["bytes_changed"] = changed;
    j["first_save_s"] = first_s;
    j["bytes_written"] = wr;
    j["bytes_referenced"] = median(referenced);
    j["bytes_logical"] = wr + median(referenced);
    j["index_bytes"] = idx;
    j["written_vs_changed"] = changed > 0 ? wr / static_cast<double>(changed) : 0.0;
    j["written_with_index_vs_changed"] = changed > 0 ? (wr + idx) / static_cast<double>(changed) : 0.0;
    j["incremental_save_s"] = inc;
    j["full_save_s"] = full;
    j["incremental_vs_full"] = full > 0 ? inc / full : 0.0;
    j["verified"] = mismatches == 0;
    j["runs"] = a.repeat;
    if (a.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("ckpt_bench (incremental): %s of state, %.3f changed between saves (%s), %d ranks, dp %d x tp %d\n",
                  human_bytes(total).c_str(), a.change_fraction, human_bytes(changed).c_str(), world, a.dp, a.tp);
      std::printf("incremental save: %.3f s, writes %s + index %s = %.3f x the changed bytes (references %s)\n", inc,
                  human_bytes(static_cast<uint64_t>(wr)).c_str(), metadata_bytes(static_cast<uint64_t>(idx)).c_str(),
                  changed > 0 ? (wr + idx) / static_cast<double>(changed) : 0.0,
                  human_bytes(static_cast<uint64_t>(median(referenced))).c_str());
      std::printf("full save of the same state: %.3f s; incremental / full = %.2f\n", full, full > 0 ? inc / full : 0.0);
      std::printf("%s; medians of %d run(s)\n", mismatches == 0 ? "verified (the last incremental checkpoint loads back)"
                                                               : "MISMATCH after loading", a.repeat);
    }
  }
  return mismatches == 0 ? 0 : kExitMismatch;
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
  app.add_option("--repeat", a.repeat, "run the phases this many times; report medians")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--async", a.async, "save with AsyncCheckpointer: report blocking_s beside save_s (until committed)");
  app.add_option("--staging", a.staging, "--async: staging memory per rank (K/M/G)")->capture_default_str();
  app.add_option("--replica-reads", a.replica_reads,
                 "load: replicas read once and share (shared), each read for itself (each), or auto")
      ->check(CLI::IsMember({"auto", "shared", "each"}))
      ->capture_default_str();
  app.add_flag("--buffered-reads", a.buffered_reads,
               "load: read chunks through the page cache straight into the buffers instead of O_DIRECT through "
               "staging (LoadOptions::direct_reads = false)");
  app.add_option("--format", a.format, "native, ckpt, safetensors or hdf5")
      ->check(CLI::IsMember({"native", "ckpt", "safetensors", "hdf5"}))
      ->capture_default_str();
  app.add_flag("--integrated", a.integrated,
               "native: write full tensors (gathered) into one file; ckpt and safetensors always are");
  app.add_option("--change-fraction", a.change_fraction,
                 "incremental saves: this fraction of the state's bytes changes between saves (whole tensors); "
                 "reports bytes written against the changed bytes, and the time against a full save")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--no-checksum", a.no_checksum,
               "save without per-chunk CRC32C (to measure its cost; loading it then needs --allow-unchecked)");
  app.add_flag("--allow-unchecked", a.allow_unchecked,
               "load a checkpoint whose data records no checksums (--no-checksum, a .ckpt without its footer)");
  app.add_option("--enc-key-file", a.enc_key_file,
                 "encrypt the checkpoint with this key file (16/24/32 raw bytes or 32/48/64 hex digits)");
  app.add_option("--enc-key-env", a.enc_key_env, "encrypt with the key in this environment variable (hex digits)");
  app.add_option("--enc-mode", a.enc_mode, "with a key: AES-GCM, AES-CBC or SM4-CBC")
      ->check(CLI::IsMember({"AES-GCM", "AES-CBC", "SM4-CBC"}, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--local-dir", a.local_dir,
                 "save to this node-local directory (tier.h) and restore from it; {host} is the node's name");
  app.add_option("--redundancy", a.redundancy, "with --local-dir: auto, partner, xor:K, rs:K+M or none")
      ->capture_default_str();
  app.add_flag("--no-recycle", a.no_recycle,
               "with --local-dir: remove each local checkpoint's files instead of keeping them as the next save's spares "
               "(LocalTier::recycle)");
  app.add_flag("--drain", a.drain,
               "with --local-dir: drain to --dir, then also restore from the global tier (page cache evicted)");
  app.add_option("--lose-node", a.lose_node,
                 "with --local-dir: wipe this node's local files before restoring (a host lost and replaced)");
  app.add_option("--peers-json", a.peers_json,
                 "write the peer harness's record to this file (rank 0): method, per-repeat save_s/load_s, "
                 "bytes_on_disk, verified");
  app.add_flag("--drop-cache", a.drop_cache,
               "before each timed load: fadvise(DONTNEED) on the checkpoint's files, then "
               "/proc/sys/vm/drop_caches where permitted (cold loads, as the peers measure them)");
  app.add_flag("--sieve", a.sieve, "read pieces under 4 KiB by data sieving (slabs of whole rows) instead of exactly");
  app.add_flag("--compare-sieve", a.compare_sieve,
               "after each timed load, the same load with data sieving: prints load_vs_sieve (medians)");
  app.add_option("--buffer-offset", a.buffer_offset,
                 "each tensor buffer starts this many bytes past a 64-byte boundary: 0 as PyTorch and XLA align "
                 "tensors, 16 as malloc places a large block")
      ->check(CLI::Range(0, 60))
      ->check([](const std::string& v) { return std::stoi(v) % 4 == 0 ? std::string() : std::string("a multiple of 4"); });
  app.add_flag("--compare-limit", a.compare_limit,
               "in each repeat, the storage's limit by fio in the same directory, run by rank 0 on every CPU while "
               "the other ranks sleep: one job per rank writing its bytes into a new file (8 MiB blocks, "
               "fallocate=none, O_DIRECT where allowed, end fsync), then a cold read of the unique bytes; "
               "prints save_vs_limit and load_vs_limit (medians); on tmpfs or ramfs where replicas make the "
               "ranks' states >= 1.25x the unique bytes, also fio's read of every rank's state, one job per "
               "rank (load_vs_needed_read)");
  app.add_flag("--compare-dd", a.compare_dd,
               "also time a dd-like sequential write+fsync and read of the same bytes in --dir, each run");
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
  if (a.no_checksum && (a.integrated || a.format != "native")) {
    if (root) std::cerr << "ckpt_bench: --no-checksum applies to sharded native saves only\n";
    return kExitUsage;
  }
  if (!a.enc_key_file.empty() && !a.enc_key_env.empty()) {
    if (root) std::fprintf(stderr, "ckpt_bench: give --enc-key-file or --enc-key-env, not both\n");
    return kExitUsage;
  }
  if (!a.enc_key_file.empty() || !a.enc_key_env.empty()) {
    auto key = !a.enc_key_file.empty() ? distckpt::EncryptionKey::from_file(a.enc_key_file)
                                       : distckpt::EncryptionKey::from_env(a.enc_key_env);
    if (!key.ok()) {
      if (root) std::cerr << "ckpt_bench: " << key.status().to_string() << "\n";
      return kExitUsage;
    }
    a.key = std::make_shared<const distckpt::EncryptionKey>(std::move(key).value());
  }
  if (a.mode == "save" && a.repeat > 1) {
    if (root) std::cerr << "ckpt_bench: --repeat needs --mode both or load\n";
    return kExitUsage;
  }
  auto size = distckpt::bench::parse_size(a.size);
  if (!size.ok()) {
    if (root) std::cerr << "ckpt_bench: --size: " << size.status().to_string() << "\n";
    return kExitUsage;
  }
  Workload w(rank);
  auto tensors = distckpt::bench::workload_tensors(*size);
  if (!tensors.ok()) {
    if (root) std::cerr << "ckpt_bench: --size: " << tensors.status().to_string() << "\n";
    return kExitUsage;
  }
  w.tensors = std::move(tensors).value();

  // ---- setup: generate this rank's slices (allocation + first touch, not timed) ----
  std::unique_ptr<distckpt::Comm> comm = distckpt::make_mpi_comm(MPI_COMM_WORLD);
  const double gen_start = MPI_Wtime();
  Status setup = generate(a, rank, w);
  const double gen_s = max_over_ranks(MPI_Wtime() - gen_start);
  if (!all_ok(setup.ok())) {
    if (root) {
      std::cerr << "ckpt_bench: setup failed: "
                << (setup.ok() ? std::string("on another rank") : setup.to_string()) << "\n";
    }
    return kExitError;
  }

  std::unique_ptr<distckpt::AsyncCheckpointer> async;
  if (a.async) {
    auto staging = distckpt::bench::parse_size(a.staging);
    distckpt::AsyncOptions options;
    options.staging_bytes = staging.ok() ? *staging : 0;
    auto created = distckpt::make_async_checkpointer(MPI_COMM_WORLD, options);
    if (!created.ok()) {
      if (root) std::cerr << "ckpt_bench: --async: " << created.status().to_string() << "\n";
      return kExitError;
    }
    async = std::move(created).value();
  }

  if (a.change_fraction >= 0) {
    if (a.format != "native" || a.integrated || a.key || !a.local_dir.empty() || a.mode != "both") {
      if (root) std::cerr << "ckpt_bench: --change-fraction: sharded native saves, not encrypted, mode both, no --local-dir\n";
      return kExitUsage;
    }
    return run_incremental_bench(a, w, *comm, async.get(), root, *size, world);
  }

  if (!a.local_dir.empty()) {
    if (a.format != "native" || a.integrated) {
      if (root) std::cerr << "ckpt_bench: --local-dir saves native sharded checkpoints\n";
      return kExitUsage;
    }
    return run_tier_bench(a, w, *comm, async.get(), root, *size, world);
  }

  Runs runs;
  const uint64_t bytes_unique = distckpt::bench::workload_bytes(w.tensors);
  MPI_Comm node_comm;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm);
  // The async reference copies (a buffer of the rank's bytes each) before the peak is
  // reset: they are the bench's, not the library's.
  if (a.async)
    for (int i = 0; i < a.repeat; ++i) runs.memcpy_s.push_back(memcpy_reference(w));
  // The baseline of peak_extra: the state and the generator are resident by now.
  distckpt::bench::reset_peak_rss();
  const uint64_t rss_at_start = distckpt::bench::proc_status()["VmRSS"];
  // --compare-limit's second reference. A load lands every rank's whole state
  // (w.rank_bytes) in its memory. On a memory file system no storage read is saved by
  // sharing (the page cache is the storage): each replica's bytes are copied once, from
  // the file or from another replica, so a load with replicas moves more than the unique
  // bytes that limit_read reads. fio reading every rank's state, one job per rank, is the
  // reference for that work (`states`, empty where it is not run). Only where replicas add
  // at least a quarter: unsplit tensors (norms, biases) are held by every TP rank too, a
  // few percent that do not need another fio run. Rank 0 decides, so that ranks on
  // different mounts cannot part ways at a collective.
  std::vector<uint64_t> states;
  if (a.compare_limit && a.mode != "save") {
    std::error_code ignored;  // the first save would make it; statfs needs it now
    if (root) std::filesystem::create_directories(a.dir, ignored);
    int memory_fs = root && distckpt::internal_storage::in_memory_file_system(a.dir) ? 1 : 0;
    MPI_Bcast(&memory_fs, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (memory_fs != 0) {
      uint64_t held = w.rank_bytes;
      states.resize(static_cast<std::size_t>(world));
      MPI_Allgather(&held, 1, MPI_UINT64_T, states.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
      for (uint64_t n : states) runs.bytes_landed += n;
      if (runs.bytes_landed < bytes_unique + bytes_unique / 4) states.clear();
    }
  }
  std::string cache_dropped = "no";
  uint64_t disk_bytes = 0;
  for (int i = 0; i < a.repeat; ++i) {
    if (a.mode != "load" && !timed_save(a, w, *comm, async.get(), root, runs)) return kExitError;
    if (root && a.mode != "load") disk_bytes = bytes_on_disk(checkpoint_path(a));
    if (a.mode != "save" && a.drop_cache) cache_dropped = drop_page_cache(checkpoint_path(a), node_comm);
    if (a.mode != "save" && !timed_load(a, w, *comm, root, runs, a.sieve)) return kExitError;
    if (a.mode != "save" && a.compare_sieve) {
      if (a.drop_cache) drop_page_cache(checkpoint_path(a), node_comm);
      if (!timed_load(a, w, *comm, root, runs, true, true)) return kExitError;
    }
    if (a.compare_limit) {
      // The checkpoint goes before fio writes, as fio's files go before the next save: each
      // timed write then follows a read and a settled delete (on a memory file system with
      // replicas, of the larger files of the second fio run below).
      if (a.mode == "both" && (!a.keep || i + 1 < a.repeat) && !remove_checkpoint(checkpoint_path(a), root)) return kExitError;
      // Each rank's share as this save wrote it (a load-only run: the unique bytes split evenly).
      uint64_t mine = runs.saved ? runs.saved->rank_bytes_written : bytes_unique / static_cast<uint64_t>(world);
      std::vector<uint64_t> shares(static_cast<std::size_t>(world));
      MPI_Gather(&mine, 1, MPI_UINT64_T, shares.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      const bool objects = distckpt::internal_storage::is_object_path(a.dir);
      const auto t = objects ? distckpt::bench::object_limit(a.dir, shares, root) : distckpt::bench::fio_limit(a.dir, shares, root);
      if (t.write_s < 0 || t.read_s < 0) return kExitError;
      runs.limit_write.push_back(t.write_s);
      runs.limit_read.push_back(t.read_s);
      runs.limit_jobs = t;
      if (!states.empty() && !objects) {
        // An optional reference: when fio cannot write these files (a small tmpfs), the run
        // goes on without it (fio_limit printed why).
        const auto n = distckpt::bench::fio_limit(a.dir, states, root);
        if (n.read_s >= 0) runs.limit_read_needed.push_back(n.read_s);
        runs.needed_jobs = n;
      }
    }
    if (a.compare_dd) {
      const auto t = distckpt::bench::dd_reference(a.dir, bytes_unique, root);
      if (t[0] < 0) return kExitError;
      runs.dd_write.push_back(t[0]);
      runs.dd_read.push_back(t[1]);
    }
  }
  const uint64_t hwm = distckpt::bench::proc_status()["VmHWM"];
  uint64_t mem[3] = {peak_rss_bytes(), w.rank_bytes, hwm > rss_at_start ? hwm - rss_at_start : 0};
  quiet_allreduce(mem, 3, MPI_UINT64_T, MPI_MAX);
  runs.peak_rss = mem[0];
  runs.rank_state_max = mem[1];
  runs.peak_extra = mem[2];
  MPI_Comm_free(&node_comm);
  if (root) report(a, w, runs, *size, world, comm->node_count(), gen_s, cache_dropped);
  if (root && !a.peers_json.empty()) {
    if (a.mode == "load") disk_bytes = bytes_on_disk(checkpoint_path(a));
    nlohmann::ordered_json record;
    record["method"] = a.format + (a.integrated ? "-integrated" : "") + (a.async ? "-async" : "");
    record["save_s"] = runs.save;
    record["load_s"] = runs.load;
    record["bytes_on_disk"] = disk_bytes;
    record["verified"] = !runs.load.empty() && runs.mismatches == 0;
    record["cache_dropped"] = cache_dropped;
    std::ofstream out(a.peers_json);
    out << nlohmann::ordered_json::array({record}).dump() << "\n";
    if (!out.good()) {
      std::cerr << "ckpt_bench: --peers-json: cannot write " << a.peers_json << "\n";
      return kExitError;
    }
  }

  if (a.mode == "both" && !a.keep && !remove_checkpoint(checkpoint_path(a), root)) return kExitError;
  if (a.mode != "save" && runs.mismatches != 0) {
    if (root) std::cerr << "ckpt_bench: " << runs.mismatches << " loaded elements differ from the workload\n";
    return kExitMismatch;
  }
  return 0;
}

}  // namespace

// --simulate-ranks: planning only, in this one process, without MPI or data.
int simulate(int argc, char** argv) {
  distckpt::internal_plan::SimulationConfig c;
  bool json = false;
  CLI::App app{"Planning-only simulation: plans a save by N simulated ranks and its load onto another layout."};
  app.add_option("--simulate-ranks", c.ranks, "simulated ranks of the save (dp x tp x pp)")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--tensors", c.tensors, "tensors of the model (6 per transformer layer)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "hidden size (bfloat16 weights of hidden x hidden multiples)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--sim-tp", c.save.tp, "save: tensor-parallel degree")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--sim-pp", c.save.pp, "save: pipeline stages")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--load-ranks", c.load_ranks, "load: simulated ranks (default: the same)")->check(CLI::NonNegativeNumber);
  app.add_option("--load-tp", c.load.tp, "load: tensor-parallel degree")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--load-pp", c.load.pp, "load: pipeline stages")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--json", json, "print one JSON line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  auto r = distckpt::internal_plan::simulate_planning(c);
  if (!r.ok()) {
    std::cerr << "ckpt_bench: --simulate-ranks: " << r.status().to_string() << "\n";
    return r.status().code() == distckpt::StatusCode::kInvalidArgument ? kExitUsage : kExitError;
  }
  const int save_dp = r->save_dp;
  if (json) {
    nlohmann::json j{{"simulate_ranks", c.ranks},
                     {"tensors", c.tensors},
                     {"state_bytes", r->state_bytes},
                     {"save", {{"dp", save_dp}, {"tp", c.save.tp}, {"pp", c.save.pp}}},
                     {"load", {{"ranks", r->load_ranks}, {"dp", r->load_dp}, {"tp", c.load.tp}, {"pp", c.load.pp}}},
                     {"describe_s", r->describe_s},
                     {"description_bytes", r->description_bytes},
                     {"plan_save_s", r->plan_save_s},
                     {"frame_index_s", r->frame_index_s},
                     {"index_bytes", r->index_bytes},
                     {"chunks", r->chunks},
                     {"files", r->files},
                     {"writer_balance", r->writer_balance},
                     {"parse_index_s", r->parse_index_s},
                     {"build_lookups_s", r->build_lookups_s},
                     {"plan_load_total_s", r->plan_load_total_s},
                     {"plan_load_max_s", r->plan_load_max_s},
                     {"reads", r->reads},
                     {"bytes_needed", r->bytes_needed}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("planning-only simulation (no MPI, no data): %d tensors, %s of bfloat16 state\n", c.tensors,
              human_bytes(r->state_bytes).c_str());
  std::printf("save  %d ranks = DP%d x TP%d x PP%d\n", c.ranks, save_dp, c.save.tp, c.save.pp);
  std::printf("  every rank: describe + fingerprint %.4f s (description %s, compared by a 32-byte fingerprint)\n",
              r->describe_s, metadata_bytes(r->description_bytes).c_str());
  std::printf("  rank 0: plan %.3f s, frame index %.3f s -> index %s (%llu bytes): %llu chunks, %llu data files, "
              "busiest writer %.2fx its lower bound\n",
              r->plan_save_s, r->frame_index_s, metadata_bytes(r->index_bytes).c_str(),
              static_cast<unsigned long long>(r->index_bytes),
              static_cast<unsigned long long>(r->chunks), static_cast<unsigned long long>(r->files),
              r->writer_balance);
  std::printf("load  %d ranks = DP%d x TP%d x PP%d (reshard)\n", r->load_ranks, r->load_dp, c.load.tp, c.load.pp);
  std::printf("  every rank: parse + validate index %.3f s, chunk lookups %.3f s, its read plan <= %.5f s\n",
              r->parse_index_s, r->build_lookups_s, r->plan_load_max_s);
  std::printf("  all %d ranks' read plans, one after another: %.3f s; %llu reads, %s needed (every box covered)\n",
              r->load_ranks, r->plan_load_total_s, static_cast<unsigned long long>(r->reads),
              human_bytes(r->bytes_needed).c_str());
  return 0;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--simulate-ranks", 16) == 0) return simulate(argc, argv);
  // --async needs MPI_THREAD_MULTIPLE (its background thread makes MPI calls).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int code = run(rank, world, argc, argv);  // destroys its Comm before MPI_Finalize
  MPI_Finalize();
  return code;
}
