// The communicator's node map, the peer watchdog, and what depends on nodes (per-host
// statistics, bytes sent between hosts by shared replica reads), without mpirun.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_comm.h"
#include "comm/peer_watchdog.h"
#include "distckpt/checkpoint.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "manager/stats.h"
#include "test_util.h"

namespace distckpt {
namespace {

using internal_comm::PeerWatchdog;

TEST(PeerWatchdog, ExpiresOnceWhenACollectiveOutlastsTheLimit) {
  std::atomic<int> calls{0};
  std::string op;
  double waited = 0;
  std::mutex mu;
  {
    PeerWatchdog dog(0.2, [&](const char* name, double s) {
      std::lock_guard<std::mutex> lock(mu);
      op = name;
      waited = s;
      ++calls;
    });
    PeerWatchdog::Scope scope(dog, "allreduce");
    // Many limits long: a stall of the watchdog's thread over 0.5 s (a busy VM) is credited
    // as time the process did not run, and must not leave the wait short of the limit.
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  }
  EXPECT_EQ(calls.load(), 1);  // once, although the scope lasted many limits
  EXPECT_EQ(op, "allreduce");
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 3.0);
}

TEST(PeerWatchdog, ShortCollectivesAndIdleTimeNeverExpire) {
  std::atomic<int> calls{0};
  PeerWatchdog dog(1.0, [&](const char*, double) { ++calls; });
  for (int i = 0; i < 40; ++i) {  // 40 x 40 ms inside collectives: 1.6 s in all, each short
    PeerWatchdog::Scope scope(dog, "barrier");
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // idle: outside any collective
  EXPECT_EQ(calls.load(), 0);
}

// A job suspended (SIGSTOP, as Slurm's `scontrol suspend` does) for longer than the
// limit while a rank waits in a collective, then continued: the stop is not waiting.
TEST(PeerWatchdog, TimeTheProcessWasStoppedIsNotWaiting) {
  std::atomic<int> calls{0};
  PeerWatchdog dog(1.2, [&](const char*, double) { ++calls; });
  {
    PeerWatchdog::Scope scope(dog, "allreduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watchdog thread is running
    const pid_t self = ::getpid();
    const pid_t waker = ::fork();
    ASSERT_GE(waker, 0);
    if (waker == 0) {  // the child continues its parent 2.5 s (twice the limit) after it stopped
      // Only async-signal-safe calls in the child of a threaded parent: open/read/usleep.
      char stat[64];
      std::snprintf(stat, sizeof stat, "/proc/%d/stat", static_cast<int>(self));
      for (int i = 0; i < 2000; ++i) {  // until the parent is stopped (state T), 20 s at most
        char text[512];
        ssize_t n = -1;
        if (const int fd = ::open(stat, O_RDONLY); fd >= 0) {
          n = ::read(fd, text, sizeof text - 1);
          ::close(fd);
        }
        const char* paren = n > 0 ? static_cast<const char*>(::memrchr(text, ')', static_cast<size_t>(n))) : nullptr;
        if (paren != nullptr && paren + 2 < text + n && paren[2] == 'T') break;
        ::usleep(10'000);
      }
      ::usleep(2'500'000);
      ::kill(self, SIGCONT);
      ::_exit(0);
    }
    ASSERT_EQ(::kill(self, SIGSTOP), 0);  // every thread stops here until the child's SIGCONT
    int status = 0;
    ASSERT_EQ(::waitpid(waker, &status, 0), waker);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a short real wait after the stop
    EXPECT_EQ(calls.load(), 0) << "the 2.5 s the process was stopped counted as waiting for peers";
  }
  // The same watchdog still ends a real wait (over three limits: a busy VM's stalls of
  // the watchdog's thread are credited, and must not keep it short of one).
  {
    PeerWatchdog::Scope scope(dog, "barrier");
    std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  }
  EXPECT_EQ(calls.load(), 1);
}

TEST(PeerWatchdog, NoLimitNoThread) {
  std::atomic<int> calls{0};
  PeerWatchdog dog(0, [&](const char*, double) { ++calls; });
  EXPECT_EQ(dog.timeout_s(), 0);
  PeerWatchdog::Scope scope(dog, "gather");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(calls.load(), 0);
}

TEST(PeerWatchdog, DefaultFromTheEnvironment) {
  ::unsetenv("DISTCKPT_PEER_TIMEOUT_S");
  EXPECT_EQ(internal_comm::default_peer_timeout_s(), 600);
  ::setenv("DISTCKPT_PEER_TIMEOUT_S", "7.5", 1);
  EXPECT_EQ(internal_comm::default_peer_timeout_s(), 7.5);
  ::setenv("DISTCKPT_PEER_TIMEOUT_S", "0", 1);
  EXPECT_EQ(internal_comm::default_peer_timeout_s(), 0);  // no limit
  for (const char* bad : {"-1", "ten", "5s", "nan", "inf"}) {
    ::setenv("DISTCKPT_PEER_TIMEOUT_S", bad, 1);
    EXPECT_EQ(internal_comm::default_peer_timeout_s(), 600) << bad;
  }
  ::unsetenv("DISTCKPT_PEER_TIMEOUT_S");
}

TEST(LocalComm, PretendedNodes) {
  auto comms = internal_comm::make_local_comms(5, 2);
  EXPECT_EQ(comms[0]->node_count(), 3);
  EXPECT_EQ(comms[0]->node_of(0), 0);
  EXPECT_EQ(comms[0]->node_of(1), 0);
  EXPECT_EQ(comms[0]->node_of(2), 1);
  EXPECT_EQ(comms[0]->node_of(4), 2);
  EXPECT_EQ(comms[3]->node_name(3), "node1");
  auto plain = internal_comm::make_local_comms(2);
  EXPECT_EQ(plain[0]->node_count(), 1);
  EXPECT_EQ(plain[1]->node_of(1), 0);
}

TEST(WriterStats, PerHost) {
  auto comms = internal_comm::make_local_comms(4, 2);
  const auto stats = internal_manager::writer_stats(*comms[0], {"1000 10", "3000 20", "2000 30", "garbage"});
  EXPECT_DOUBLE_EQ(stats.fastest_s, 0);  // the line that does not parse counts as zero
  EXPECT_DOUBLE_EQ(stats.slowest_s, 0.003);
  ASSERT_EQ(stats.hosts.size(), 2u);
  EXPECT_EQ(stats.hosts[0]["host"], "node0");
  EXPECT_EQ(stats.hosts[0]["ranks"], 2);
  EXPECT_EQ(stats.hosts[0]["bytes"], 30);
  EXPECT_DOUBLE_EQ(stats.hosts[0]["write_s"].get<double>(), 0.003);
  EXPECT_EQ(stats.hosts[1]["host"], "node1");
  EXPECT_EQ(stats.hosts[1]["bytes"], 30);
  EXPECT_DOUBLE_EQ(stats.hosts[1]["write_s"].get<double>(), 0.002);
}

// 4 ranks on 2 pretended nodes hold a tensor replicated on all of them: with shared
// replica reads it is read once and sent to the 3 others, 2 of them on the other node.
TEST(SharedReplicaReads, CountBytesBetweenHosts) {
  testing::TempDir dir;
  constexpr int64_t kElems = 1024;
  std::mutex mu;
  std::vector<std::string> errors;
  internal_comm::run_local_ranks(
      4,
      [&](Comm& comm) {
        auto fail = [&](const Status& st) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back("rank " + std::to_string(comm.rank()) + ": " + st.to_string());
        };
        auto layout = TensorLayout::from_device_matrix({kElems}, {4}, {-1});
        if (!layout.ok()) return fail(layout.status());
        std::vector<float> data(kElems, 1.5f);
        StateDict state(comm.rank());
        if (Status st = state.add_tensor("w", DType::kFloat32, data.data(), *layout); !st.ok()) return fail(st);
        SaveOptions save_opts;
        save_opts.name = "ck";
        if (auto saved = save(comm, state, dir.path(), save_opts); !saved.ok()) return fail(saved.status());
        std::fill(data.begin(), data.end(), 0.0f);
        LoadOptions opts;
        opts.replica_reads = LoadOptions::ReplicaReads::kAuto;  // several nodes: shared
        auto loaded = load(comm, state, dir.path() + "/ck", opts);
        if (!loaded.ok()) return fail(loaded.status());
        EXPECT_EQ(data, std::vector<float>(kElems, 1.5f));
        EXPECT_EQ(loaded->bytes_read, kElems * 4u);
        EXPECT_EQ(loaded->bytes_between_hosts, 2 * kElems * 4u);
      },
      /*ranks_per_node=*/2);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

}  // namespace
}  // namespace distckpt
