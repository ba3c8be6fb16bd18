#include "storage_limits.h"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "quiet_mpi.h"

namespace distckpt::bench {
namespace {

// fio rounds per limit. One round's time on a virtual machine depends on which pages it
// gets: pages the machine has not used lately (given back to the host after a free) cost
// several times more on first use, and the first round after the ranks made their state
// and a save took 0.45-1.05 s against 0.20-0.32 s for the others (1 GiB, /dev/shm). The
// median of three is the device's, not one round's luck.
constexpr int kRuns = 3;

// The job file of one fio run over `rank_bytes` (one job per rank that has bytes).
// fallocate=none: fio otherwise preallocates each file before the timed write
// (posix_fallocate), which on a tmpfs makes every page in advance, so that its "write"
// only overwrites them. A save writes new files; so does the limit.
std::string job_file(const std::string& work, const std::vector<uint64_t>& rank_bytes, bool write, bool direct) {
  std::ostringstream jf;
  jf << "[global]\ndirectory=" << work << "\nbs=8M\nioengine=psync\nfallocate=none\n"
     << (write ? "rw=write\nend_fsync=1\n" : "rw=read\ninvalidate=1\n") << "direct=" << (direct && write ? 1 : 0)
     << "\n";
  for (std::size_t r = 0; r < rank_bytes.size(); ++r)
    if (rank_bytes[r] > 0) jf << "[rank" << r << "]\nfilename=rank-" << r << "\nsize=" << rank_bytes[r] << "\n";
  return jf.str();
}

// Every CPU of the machine: mpirun may have bound rank 0 to one core, and fio run alone
// is not bound. Returns how many CPUs the mask holds after the kernel's cpuset.
int widen_affinity(cpu_set_t* saved) {
  sched_getaffinity(0, sizeof *saved, saved);
  cpu_set_t all;
  CPU_ZERO(&all);
  const long configured = std::min<long>(sysconf(_SC_NPROCESSORS_CONF), CPU_SETSIZE);
  for (long c = 0; c < configured; ++c) CPU_SET(static_cast<int>(c), &all);
  (void)sched_setaffinity(0, sizeof all, &all);  // the kernel keeps it inside the cpuset
  cpu_set_t now;
  sched_getaffinity(0, sizeof now, &now);
  return CPU_COUNT(&now);
}

// Runs fio on `jobfile`; the slowest job's runtime in seconds (fio's own start-up
// excluded), or -1 after printing why not.
double run_fio(const std::string& jobfile, int* cpus) {
  cpu_set_t saved;
  *cpus = widen_affinity(&saved);
  const std::string cmd = "fio --output-format=json " + jobfile + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  (void)sched_setaffinity(0, sizeof saved, &saved);  // the child has the wide mask
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  const auto brace = out.find('{');
  auto j = nlohmann::json::parse(brace == std::string::npos ? std::string() : out.substr(brace), nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("jobs")) {
    std::cerr << "ckpt_bench: fio failed (install it: scripts/setup.sh): " << out.substr(0, 400) << "\n";
    return -1;
  }
  double slowest = 0;
  for (const auto& job : j["jobs"]) slowest = std::max(slowest, job.value("job_runtime", 0.0) / 1e3);
  return slowest;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void settle_deletes(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::syncfs(fd);
  ::close(fd);
}

FioLimit fio_limit(const std::string& dir, const std::vector<uint64_t>& rank_bytes, bool root) {
  FioLimit limit;
  quiet_barrier();
  if (root) {
    const std::string work = dir + "/.fio-limit";
    std::error_code ec;
    std::filesystem::create_directories(work, ec);
    const std::string probe = work + "/probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0600);
    const bool direct = fd >= 0;
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    limit.write_job = job_file(work, rank_bytes, true, direct);
    limit.read_job = job_file(work, rank_bytes, false, direct);
    std::ofstream(work + "/write.fio") << limit.write_job;
    std::ofstream(work + "/read.fio") << limit.read_job;
    // Each time is the median of kRuns write-and-read rounds, the files removed after each.
    std::vector<double> writes, reads;
    for (int round = 0; round < kRuns; ++round) {
      const double w = run_fio(work + "/write.fio", &limit.cpus);
      const double r = w < 0 ? -1 : run_fio(work + "/read.fio", &limit.cpus);
      if (r < 0) break;
      writes.push_back(w);
      reads.push_back(r);
      for (std::size_t job = 0; job < rank_bytes.size(); ++job)
        ::unlink((work + "/rank-" + std::to_string(job)).c_str());
      settle_deletes(work + "/write.fio");
    }
    if (writes.size() == static_cast<std::size_t>(kRuns)) {
      limit.write_s = median(writes);
      limit.read_s = median(reads);
    }
    std::filesystem::remove_all(work, ec);
    settle_deletes(work);
  }
  double t[2] = {limit.write_s, limit.read_s};
  quiet_bcast(t, 2, MPI_DOUBLE, 0);
  limit.write_s = t[0];
  limit.read_s = t[1];
  return limit;
}

std::array<double, 2> dd_reference(const std::string& dir, uint64_t bytes, bool root) {
  std::array<double, 2> t{0, 0};
  quiet_barrier();
  if (root) {
    const std::string file = dir + "/dd-reference.bin";
    constexpr size_t kBlock = 4u << 20;
    std::vector<char> block(kBlock, 1);
    const double t0 = MPI_Wtime();
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0;
    for (uint64_t done = 0; ok && done < bytes; done += kBlock) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, bytes - done));
      ok = ::pwrite(fd, block.data(), n, static_cast<off_t>(done)) == static_cast<ssize_t>(n);
    }
    if (fd >= 0) {
      ok = ::fsync(fd) == 0 && ok;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    t[0] = MPI_Wtime() - t0;
    const double t1 = MPI_Wtime();
    const int rfd = ok ? ::open(file.c_str(), O_RDONLY) : -1;
    uint64_t read_bytes = 0;
    for (ssize_t n; rfd >= 0 && (n = ::read(rfd, block.data(), kBlock)) > 0;) read_bytes += static_cast<uint64_t>(n);
    if (rfd >= 0) ::close(rfd);
    t[1] = MPI_Wtime() - t1;
    ::unlink(file.c_str());
    settle_deletes(file);
    if (!ok || read_bytes != bytes) {
      std::cerr << "ckpt_bench: --compare-dd: writing or reading " << bytes << " bytes of " << file
                << " failed: " << std::strerror(errno) << "\n";
      t = {-1, -1};
    }
  }
  quiet_bcast(t.data(), 2, MPI_DOUBLE, 0);
  return t;
}

}  // namespace distckpt::bench
