// Memory figures of this process from /proc (Linux), shared by ckpt_bench and the
// memory-bound tests (mpi_tests/memory_bound.cc).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace distckpt::bench {

// The "kB" fields of /proc/self/status (VmRSS, VmHWM, RssAnon, RssFile, RssShmem...),
// in bytes; empty where /proc is not there.
inline std::map<std::string, uint64_t> proc_status() {
  std::ifstream in("/proc/self/status");
  std::map<std::string, uint64_t> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream value(line.substr(colon + 1));
    uint64_t kib = 0;
    std::string unit;
    if (value >> kib >> unit && unit == "kB") out[line.substr(0, colon)] = kib * 1024;
  }
  return out;
}

// Resets this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); whether it
// took is for the caller to check (VmHWM close to VmRSS afterwards).
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5\n"; }

}  // namespace distckpt::bench
