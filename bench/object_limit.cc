// --compare-limit for an object root (s3://bucket/prefix): the store's limit measured by
// curl, an S3 client that is not ours, in the same run: one upload per rank of its share
// (one PUT streamed from memory, as each rank streams its data object), then each object
// read back once. curl gets its options, the credentials among them, on its standard input,
// never on its command line or in a file.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>

#include "quiet_mpi.h"
#include "storage/s3_config.h"
#include "storage/s3_http.h"
#include "storage_limits.h"

namespace distckpt::bench {
namespace {

using internal_storage::S3Config;

// Runs curl with `options` (curl's config-file syntax) on top of the store's own, given on
// its standard input; returns the seconds it took, or -1 (curl's message on stderr).
double run_curl(const S3Config& c, const std::string& url, const std::string& options) {
  std::string config = "url = \"" + url + "\"\nuser = \"" + c.access_key + ":" + c.secret_key + "\"\n" +
                       "aws-sigv4 = \"aws:amz:" + c.region + ":s3\"\n" +
                       "header = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"\n" +
                       "silent\nshow-error\nfail\noutput = \"/dev/null\"\n" + options;
  if (!c.session_token.empty()) config += "header = \"x-amz-security-token: " + c.session_token + "\"\n";
  if (!c.ca_bundle.empty()) config += "cacert = \"" + c.ca_bundle + "\"\n";
  const auto start = std::chrono::steady_clock::now();
  std::FILE* curl = ::popen("curl -K -", "w");
  if (curl == nullptr) return -1;
  std::fwrite(config.data(), 1, config.size(), curl);
  const int rc = ::pclose(curl);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rc == 0 ? s : -1;
}

}  // namespace

FioLimit object_limit(const std::string& dir, const std::vector<uint64_t>& rank_bytes, bool root) {
  FioLimit limit;
  limit.tool = "curl";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t mine = 0;
  MPI_Scatter(root ? rank_bytes.data() : nullptr, 1, MPI_UINT64_T, &mine, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  auto config = internal_storage::s3_config_from_environment();
  auto url = internal_storage::parse_s3_url(dir);
  double ok = config.ok() && url.ok() ? 1 : 0;
  if (!ok && root) std::fprintf(stderr, "object limit: %s\n", (config.ok() ? url.status() : config.status()).to_string().c_str());
  // The bytes to send, in memory (/dev/shm), made before the clock starts.
  char scratch_name[] = "/dev/shm/distckpt-object-limit-XXXXXX";  // made with O_EXCL, owner-only
  const int scratch_fd = ::mkstemp(scratch_name);
  if (scratch_fd < 0) ok = 0;
  else ::close(scratch_fd);
  const std::string scratch = scratch_name;
  if (ok) {
    std::ofstream out(scratch, std::ios::binary);
    std::vector<char> block(8 << 20);
    std::mt19937_64 random(static_cast<uint64_t>(rank) + 1);
    for (auto& b : block) b = static_cast<char>(random());
    for (uint64_t left = mine; left > 0;) {
      const auto n = static_cast<std::streamsize>(std::min<uint64_t>(left, block.size()));
      out.write(block.data(), n);
      left -= static_cast<uint64_t>(n);
    }
    ok = out.good() ? 1 : 0;
  }
  ok = -quiet_max(-ok);
  std::vector<double> writes, reads;
  for (int round = 0; ok && round < 3; ++round) {
    internal_storage::S3Request object;
    object.key = (url->prefix.empty() ? "" : url->prefix + "/") + ".object-limit/rank-" + std::to_string(rank);
    const std::string target = internal_storage::s3_request_url(*config, url->bucket, object);
    timed_phase_barrier();
    const double w = quiet_max(run_curl(*config, target, "upload-file = \"" + scratch + "\"\n"));
    timed_phase_barrier();
    const double r = quiet_max(run_curl(*config, target, ""));
    (void)run_curl(*config, target, "request = \"DELETE\"\n");
    double failed = w < 0 || r < 0 ? 1 : 0;
    if (quiet_max(failed) > 0) break;
    writes.push_back(w);
    reads.push_back(r);
  }
  ::unlink(scratch.c_str());
  if (writes.size() == 3) {
    limit.write_s = median(writes);
    limit.read_s = median(reads);
  }
  limit.write_job = "curl PUT (one per rank, its share streamed from memory, SigV4, UNSIGNED-PAYLOAD)";
  limit.read_job = "curl GET (one per rank, of its object, to /dev/null)";
  return limit;
}

}  // namespace distckpt::bench
