// The root directory's protocol without MPI: owner records, garbage collection of
// abandoned saves, claims of commit numbers and series, the latest lock, and listing of
// empty, truncated and foreign files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "catalog/claims.h"
#include "catalog/commit.h"
#include "catalog/gc.h"
#include "catalog/names.h"
#include "catalog/owner.h"
#include "distckpt/inspect.h"
#include "format/native/index_codec.h"
#include "manager/stats.h"
#include "storage/fault_fs.h"
#include "test_util.h"

namespace distckpt::internal_catalog {
namespace {

namespace fs = std::filesystem;
using distckpt::testing::TempDir;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A temporary entry as a save makes it, owned by `owner`.
std::string make_entry(const std::string& root, const std::string& name, const OwnerRecord& owner) {
  const std::string dir = make_tmp_name(root, name);
  fs::create_directories(dir);
  write_text(dir + "/" + kOwnerFile, owner.to_json());
  write_text(dir + "/data-00000.bin", std::string(1000, 'x'));
  return dir;
}

// The record of a process that existed on this host and is gone now.
OwnerRecord dead_local_owner() {
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  OwnerRecord r = OwnerRecord::self();
  r.pid = child;
  // Read while it runs (its start time), then let it go.
  std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  r.start_time = 0;
  const auto close = text.rfind(')');
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
  }
  r.start_time = std::stoull(f);
  return r;
}

void age(const std::string& path, std::chrono::seconds by) {
  fs::last_write_time(path, fs::last_write_time(path) - by);
}

TEST(Owner, RecordRoundTripsAndSaysWhoIsAlive) {
  const OwnerRecord me = OwnerRecord::self();
  EXPECT_TRUE(me.is_local());
  EXPECT_FALSE(me.local_process_gone());
  auto back = OwnerRecord::from_json(me.to_json());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->pid, me.pid);
  EXPECT_EQ(back->start_time, me.start_time);
  EXPECT_EQ(OwnerRecord::from_json("{}").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(OwnerRecord::from_json("not json").status().code(), StatusCode::kCorruption);
  const OwnerRecord dead = dead_local_owner();
  EXPECT_TRUE(dead.is_local());
  EXPECT_TRUE(dead.local_process_gone());
  // The same pid with another start time is another process.
  OwnerRecord reused = me;
  reused.start_time += 1;
  EXPECT_TRUE(reused.local_process_gone());
  OwnerRecord elsewhere = me;
  elsewhere.hostname += "-other";
  EXPECT_FALSE(elsewhere.is_local());
}

TEST(Gc, RemovesOnlyEntriesWhoseOwnerIsProvablyGone) {
  TempDir dir;
  const std::string root = dir.path();
  FileSystem& fsys = *posix_filesystem();
  fs::create_directories(root + "/committed");
  write_text(root + "/committed/index.pb", "whatever");
  const std::string alive = make_entry(root, "alive", OwnerRecord::self());
  const std::string dead = make_entry(root, "dead", dead_local_owner());
  OwnerRecord remote = OwnerRecord::self();
  remote.hostname = "node-elsewhere";
  const std::string fresh_remote = make_entry(root, "fresh", remote);
  write_text(fresh_remote + "/" + kHeartbeatFile, "1\n");
  const std::string stale_remote = make_entry(root, "stale", remote);
  write_text(stale_remote + "/" + kHeartbeatFile, "1\n");
  age(stale_remote + "/" + kHeartbeatFile, std::chrono::hours(1));
  const std::string ownerless = make_tmp_name(root, "old-build");
  fs::create_directories(ownerless);
  age(ownerless, std::chrono::hours(3));

  GcOptions dry;
  dry.dry_run = true;
  auto report = collect_garbage(fsys, root, dry);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  std::set<std::string> would;
  for (const auto& e : report->removed) would.insert(e.name.substr(0, e.name.find(".tmp-")));
  EXPECT_EQ(would, (std::set<std::string>{"dead", "stale"}));
  EXPECT_TRUE(fs::exists(dead));  // a dry run removes nothing

  auto done = collect_garbage(fsys, root, GcOptions{});
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(stale_remote));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(fresh_remote));
  EXPECT_TRUE(fs::exists(ownerless));  // no owner record: only by hand
  EXPECT_TRUE(fs::exists(root + "/committed/index.pb"));

  GcOptions by_hand;
  by_hand.older_than_s = 2 * 3600;
  ASSERT_TRUE(collect_garbage(fsys, root, by_hand).ok());
  EXPECT_FALSE(fs::exists(ownerless));
  EXPECT_TRUE(fs::exists(alive));  // never an entry whose owner runs, whatever its age
  EXPECT_TRUE(fs::exists(fresh_remote));
}

// The catalog's temporary files (latest's, the commit counter's) name their owner: a
// process killed between writing one and renaming it leaves a file gc removes once that
// owner is gone, by the rules of a save's entry; one whose owner runs stays.
TEST(Gc, CollectsTemporaryFilesOnceTheirOwnerIsGone) {
  TempDir dir;
  const std::string root = dir.path();
  FileSystem& fsys = *posix_filesystem();
  // A child writes latest's temporary file and is killed before its rename.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    const std::string tmp = make_owned_tmp_name(root, "latest");
    std::ofstream(tmp) << "run-0_4\n";
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  const std::string mine = make_owned_tmp_name(root + "/" + kMetaDir, "seq");  // this process: running
  fs::create_directories(root + "/" + kMetaDir);
  write_text(mine, "8\n");
  // Another host's: judged by age against the lease (it lives for one write and rename).
  const std::string remote_fresh = root + "/latest.tmp-00000000000000aa.owner-0badcafe-12-34";
  const std::string remote_stale = root + "/latest.tmp-00000000000000bb.owner-0badcafe-12-34";
  write_text(remote_fresh, "x\n");
  write_text(remote_stale, "x\n");
  age(remote_stale, std::chrono::hours(1));
  std::set<std::string> before;
  for (const auto& e : fs::directory_iterator(root)) before.insert(e.path().filename().string());
  ASSERT_EQ(before.size(), 4u);  // the child's, two remote ones, the catalog directory

  auto done = collect_garbage(fsys, root, GcOptions{});
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{kMetaDir, "latest.tmp-00000000000000aa.owner-0badcafe-12-34"}));
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_EQ(done->removed.size(), 2u);
  EXPECT_FALSE(tmp_file_owner("latest.tmp-0123456789abcdef").has_value());  // an older build's: by hand only
}

// A lock a breaker set aside (it found a new holder in it and could not put it back, or
// the breaker died half way) is collected by the same rules as a save's entry; the
// catalog's own records are never touched.
TEST(Gc, CollectsLocksSetAsideOnceTheirOwnerIsGone) {
  TempDir dir;
  const std::string root = dir.path();
  const std::string meta = root + "/" + kMetaDir;
  FileSystem& fsys = *posix_filesystem();
  fs::create_directories(meta + "/tier");
  write_text(meta + "/seq", "7\n");
  const std::string dead_aside = make_entry(meta, "seq.lock.broken", dead_local_owner());
  const std::string live_aside = make_entry(meta, "latest.lock.broken", OwnerRecord::self());
  OwnerRecord remote = OwnerRecord::self();
  remote.hostname = "node-elsewhere";
  const std::string stale_aside = make_entry(meta, "references.lock.broken", remote);
  write_text(stale_aside + "/" + kHeartbeatFile, "1700000000000 3\n");
  age(stale_aside + "/" + kHeartbeatFile, std::chrono::hours(1));
  const std::string counter_tmp = make_tmp_name(meta, "seq");  // a claim killed before its rename
  write_text(counter_tmp, "8\n");
  age(counter_tmp, std::chrono::hours(3));

  auto done = collect_garbage(fsys, root, GcOptions{});
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  std::set<std::string> removed;
  for (const auto& e : done->removed) removed.insert(e.name.substr(0, e.name.find(".tmp-")));
  EXPECT_EQ(removed, (std::set<std::string>{".distckpt/seq.lock.broken", ".distckpt/references.lock.broken"}));
  EXPECT_FALSE(fs::exists(dead_aside));
  EXPECT_FALSE(fs::exists(stale_aside));
  EXPECT_TRUE(fs::exists(live_aside));   // its owner runs: it may still be judging it
  EXPECT_TRUE(fs::exists(counter_tmp));  // no owner record: only by hand
  EXPECT_TRUE(fs::exists(meta + "/seq"));
  EXPECT_TRUE(fs::exists(meta + "/tier"));

  GcOptions by_hand;
  by_hand.older_than_s = 2 * 3600;
  ASSERT_TRUE(collect_garbage(fsys, root, by_hand).ok());
  EXPECT_FALSE(fs::exists(counter_tmp));
  EXPECT_TRUE(fs::exists(live_aside));
  EXPECT_TRUE(fs::exists(meta + "/seq"));
}

TEST(Gc, DurationsParse) {
  EXPECT_EQ(*parse_duration_s("30m"), 1800);
  EXPECT_EQ(*parse_duration_s("2h"), 7200);
  EXPECT_EQ(*parse_duration_s("7d"), 7 * 86400);
  EXPECT_EQ(*parse_duration_s("90"), 90);
  EXPECT_FALSE(parse_duration_s("soon").ok());
  EXPECT_FALSE(parse_duration_s("-1h").ok());
}

TEST(Claims, CommitNumbersAreNeverHandedOutTwice) {
  TempDir dir;
  std::mutex mu;
  std::vector<uint64_t> got;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        auto n = claim_commit_seq(*posix_filesystem(), dir.path());
        ASSERT_TRUE(n.ok()) << n.status().to_string();
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(*n);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()).size(), got.size());
  // The counter is one small file; the lock is gone.
  EXPECT_TRUE(fs::is_regular_file(dir.path() + "/" + kMetaDir + "/seq"));
  EXPECT_FALSE(fs::exists(dir.path() + "/" + kMetaDir + "/seq.lock"));
}

// A counter near 2^64 (damaged or forged) is ignored, not wrapped to 0; the last number a
// reader accepts is never handed out past.
TEST(Claims, ACounterPastTheLimitIsIgnoredAndNumbersNeverWrap) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  ASSERT_TRUE(claim_commit_seq(fsys, dir.path()).ok());  // makes the counter
  const std::string counter = dir.path() + "/" + kMetaDir + "/seq";
  for (const char* text : {"18446744073709551615\n", "4611686018427387904\n", "garbage\n"}) {
    write_text(counter, text);
    auto n = claim_commit_seq(fsys, dir.path());
    ASSERT_TRUE(n.ok()) << text << n.status().to_string();
    EXPECT_EQ(*n, 1u) << text;  // no checkpoint in the root: numbering starts again at 1
  }
  write_text(counter, std::to_string(internal_format::kCommitSeqLimit - 2) + "\n");
  auto last = claim_commit_seq(fsys, dir.path());
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_EQ(*last, internal_format::kCommitSeqLimit - 1);
  // A counter alone cannot exhaust the numbers (at the last one, it is not believed)...
  auto again = claim_commit_seq(fsys, dir.path());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, 1u);
  // ... a (forged) checkpoint that holds the last one does: refused, never wrapped.
  proto::Index forged;
  forged.set_name("forged");
  forged.set_world_size(1);
  forged.set_commit_seq(internal_format::kCommitSeqLimit - 1);
  fs::create_directories(dir.path() + "/forged");
  write_text(dir.path() + "/forged/" + internal_format::kIndexFileName, internal_format::frame_index(forged));
  write_text(dir.path() + "/latest", "forged\n");
  auto past = claim_commit_seq(fsys, dir.path());
  EXPECT_EQ(past.status().code(), StatusCode::kCorruption) << past.status().to_string();
  EXPECT_NE(past.status().message().find("exhausted"), std::string::npos) << past.status().to_string();
}

TEST(Claims, SeriesPrefixesAreClaimedOncePerJob) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  auto none = [](const std::string&) { return false; };
  auto a = claim_series(fsys, dir.path(), "ckpt", "job-a", none);
  auto b = claim_series(fsys, dir.path(), "ckpt", "job-b", none);
  auto c = claim_series(fsys, dir.path(), "ckpt", "", none);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, "ckpt");
  EXPECT_EQ(*b, "ckpt_1");
  EXPECT_EQ(*c, "ckpt_2");
  // A requeued job takes its own back.
  EXPECT_EQ(*claim_series(fsys, dir.path(), "ckpt", "job-b", none), "ckpt_1");
  // A prefix whose series has checkpoints is not taken, claimed or not.
  auto d = claim_series(fsys, dir.path(), "run", "", [](const std::string& p) { return p == "run"; });
  EXPECT_EQ(*d, "run_1");
  release_series(fsys, dir.path(), "ckpt_2");
  EXPECT_EQ(*claim_series(fsys, dir.path(), "ckpt", "", none), "ckpt_2");
}

TEST(Claims, LatestLockExcludesAndIsBrokenWhenItsOwnerDied) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  auto held = RootLock::acquire(fsys, dir.path(), "latest", 1);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(RootLock::acquire(fsys, dir.path(), "latest", 0.05).status().code(), StatusCode::kAborted);
  held->reset();
  ASSERT_TRUE(RootLock::acquire(fsys, dir.path(), "latest", 1).ok());
  // A lock left by a process that died holding it is broken at once.
  const std::string lock = dir.path() + "/" + kMetaDir + "/latest.lock";
  fs::create_directories(lock);
  write_text(lock + "/" + kOwnerFile, dead_local_owner().to_json());
  EXPECT_TRUE(RootLock::acquire(fsys, dir.path(), "latest", 0.05).ok());
}

// A lock `what` of `root` as a process on the host `hostname` holds it; returns its path.
std::string forge_remote_lock(const std::string& root, const std::string& what, const std::string& hostname) {
  const std::string lock = root + "/" + kMetaDir + "/" + what + ".lock";
  fs::create_directories(lock);
  OwnerRecord remote = OwnerRecord::self();
  remote.hostname = hostname;
  write_text(lock + "/" + kOwnerFile, remote.to_json());
  return lock;
}

// A lock whose holder was on a host that died: its heartbeat stands still, and the next
// job (a requeue, seconds later) breaks it after the silence instead of failing its save.
TEST(Claims, ARemoteLockWhoseHeartbeatStandsStillIsBroken) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  const std::string lock = forge_remote_lock(dir.path(), "seq", "node-that-died");
  write_text(lock + "/" + kHeartbeatFile, "1700000000000 7\n");
  const auto start = std::chrono::steady_clock::now();
  auto taken = RootLock::acquire(fsys, dir.path(), "seq", /*timeout_s=*/10, /*silence_s=*/0.6);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(taken.ok()) << taken.status().to_string();
  EXPECT_GE(waited, 0.6);
  EXPECT_LT(waited, 5);
  EXPECT_TRUE((*taken)->still_held().ok());
  // Nothing of the broken lock is left beside the new one.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path() + "/" + kMetaDir)) entries += e.path().filename() != "seq.lock";
  EXPECT_EQ(entries, 0);
}

// A holder on another host that is alive (its heartbeat moves) is waited for, however
// long it holds the lock: the waiter gives up at its timeout instead.
TEST(Claims, ARemoteLockWhoseHeartbeatMovesIsNeverBroken) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  const std::string lock = forge_remote_lock(dir.path(), "latest", "node-alive");
  std::atomic<bool> stop{false};
  std::thread beating([&] {
    for (int n = 0; !stop.load(); ++n) {
      write_text(lock + "/" + kHeartbeatFile, "1700000000000 " + std::to_string(n) + "\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
  });
  auto taken = RootLock::acquire(fsys, dir.path(), "latest", /*timeout_s=*/4, /*silence_s=*/1.5);
  stop = true;
  beating.join();
  EXPECT_EQ(taken.status().code(), StatusCode::kAborted);
  EXPECT_NE(taken.status().message().find("stayed held"), std::string::npos) << taken.status().to_string();
  EXPECT_TRUE(fs::exists(lock + "/" + kOwnerFile));
}

// A holder stalled past a waiter's silence learns that its lock was broken before it
// publishes anything, and does not remove the new holder's lock when it lets go.
TEST(Claims, AHolderWhoseLockWasBrokenKnowsItAndLeavesTheNewOne) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  auto held = RootLock::acquire(fsys, dir.path(), "seq", 1);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE((*held)->still_held().ok());
  const std::string lock = dir.path() + "/" + kMetaDir + "/seq.lock";
  // What a waiter on another host does when this process is silent: aside, then a new lock.
  fs::rename(lock, lock + ".aside");
  fs::remove_all(lock + ".aside");
  fs::create_directories(lock);
  OwnerRecord other = OwnerRecord::self();
  other.hostname = "node-new-holder";
  write_text(lock + "/" + kOwnerFile, other.to_json());
  const Status st = (*held)->still_held();
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_NE(st.message().find("was broken while held"), std::string::npos) << st.to_string();
  // Its heartbeat does not beat into the new holder's lock (which would keep a dead
  // new holder looking alive).
  std::this_thread::sleep_for(std::chrono::duration<double>(kLockBeatSeconds * 2.5));
  EXPECT_FALSE(fs::exists(lock + "/" + kHeartbeatFile));
  held->reset();
  EXPECT_TRUE(fs::exists(lock + "/" + kOwnerFile)) << "the new holder's lock was removed";
}

// While held, the holder's heartbeat moves (what waiters on other hosts watch).
TEST(Claims, AHeldLockBeats) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  auto held = RootLock::acquire(fsys, dir.path(), "references", 1);
  ASSERT_TRUE(held.ok());
  const std::string beat = dir.path() + "/" + kMetaDir + "/references.lock/" + kHeartbeatFile;
  const std::string first = read_text(beat);
  EXPECT_FALSE(first.empty());
  std::this_thread::sleep_for(std::chrono::duration<double>(kLockBeatSeconds * 2.5));
  EXPECT_NE(read_text(beat), first);
  held->reset();
  EXPECT_FALSE(fs::exists(dir.path() + "/" + kMetaDir + "/references.lock"));
}

TEST(Listing, EmptyTruncatedAndForeignFilesFailClosed) {
  TempDir dir;
  const std::string root = dir.path();
  write_text(root + "/empty.ckpt", "");
  write_text(root + "/empty.safetensors", "");
  write_text(root + "/empty.h5", "");
  write_text(root + "/lightning.ckpt", std::string("PK\x03\x04", 4) + std::string(100, 'z'));
  write_text(root + "/pickled.ckpt", std::string("\x80\x04\x95", 3) + std::string(100, 'p'));
  write_text(root + "/notes.safetensors", "these are my notes about the model\n");
  write_text(root + "/text.h5", "not an hdf5 file at all, just text\n");
  auto listing = list_checkpoints(root);
  ASSERT_TRUE(listing.ok());
  std::map<std::string, EntryState> state;
  for (const auto& e : listing->entries) state[e.name] = e.state;
  EXPECT_EQ(state["empty.ckpt"], EntryState::kBroken);
  EXPECT_EQ(state["empty.safetensors"], EntryState::kBroken);
  EXPECT_EQ(state["empty.h5"], EntryState::kBroken);
  EXPECT_EQ(state["lightning.ckpt"], EntryState::kForeign);
  EXPECT_EQ(state["pickled.ckpt"], EntryState::kForeign);
  EXPECT_EQ(state["notes.safetensors"], EntryState::kForeign);
  EXPECT_EQ(state["text.h5"], EntryState::kForeign);
  for (const char* name : {"empty.ckpt", "empty.safetensors", "empty.h5"}) {
    auto v = verify_checkpoint(root + "/" + name);
    EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << name;
    EXPECT_NE(v.status().message().find("empty file"), std::string::npos) << v.status().to_string();
  }
  auto lightning = verify_checkpoint(root + "/lightning.ckpt");
  EXPECT_NE(lightning.status().message().find("not a MindSpore .ckpt file: it is a zip archive"), std::string::npos)
      << lightning.status().to_string();
  EXPECT_NE(verify_checkpoint(root + "/pickled.ckpt").status().message().find("pickle"), std::string::npos);
  // Nothing committed: a root of only damaged and foreign files has nothing to resume.
  EXPECT_EQ(resolve_checkpoint(root).status().code(), StatusCode::kNotFound);
}

TEST(Names, TheCatalogsOwnNamesAreNotCheckpointNames) {
  EXPECT_FALSE(validate_checkpoint_name(".distckpt").ok());
  EXPECT_FALSE(validate_checkpoint_name(".distckpt-x").ok());
  EXPECT_TRUE(validate_checkpoint_name(".hidden").ok());
  EXPECT_EQ(trashed_name("run-0_4.tmp-deleting-0123456789abcdef"), std::optional<std::string>("run-0_4"));
  EXPECT_EQ(trashed_name("run-0_4.tmp-0123456789abcdef"), std::nullopt);
}

TEST(Stats, AppendedWholeThroughTheFileSystemAndATornLineIsTolerated) {
  TempDir dir;
  FileSystem& fsys = *posix_filesystem();
  ASSERT_TRUE(internal_manager::append_stats_line(fsys, dir.path(), {{"step", 1}}).ok());
  // A crash mid-append: the last line has no newline.
  {
    std::ofstream out(dir.path() + "/stats.jsonl", std::ios::app);
    out << R"({"step":2,"na)";
  }
  ASSERT_TRUE(internal_manager::append_stats_line(fsys, dir.path(), {{"step", 3}}).ok());
  auto lines = internal_manager::read_stats_lines(fsys, dir.path());
  ASSERT_TRUE(lines.ok());
  EXPECT_EQ(*lines, (std::vector<std::string>{R"({"step":1})", R"({"step":3})"}));
  // A string that is not UTF-8 (a directory named in Latin-1) is written, not thrown.
  ASSERT_TRUE(internal_manager::append_stats_line(fsys, dir.path(), {{"path", "/data/caf\xe9"}}).ok());
  lines = internal_manager::read_stats_lines(fsys, dir.path());
  ASSERT_TRUE(lines.ok());
  ASSERT_EQ(lines->size(), 3u);
  EXPECT_EQ(lines->back(), "{\"path\":\"/data/caf\xef\xbf\xbd\"}");
  EXPECT_EQ(fs::status(dir.path() + "/stats.jsonl").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // Through the FileSystem: a full disk is reported, not ignored.
  internal_storage::FaultSpec spec;
  spec.write_budget = 0;
  internal_storage::FaultFileSystem full(posix_filesystem(), spec);
  EXPECT_NE(internal_manager::append_stats_line(full, dir.path(), nlohmann::ordered_json::object())
                .message()
                .find("No space left"),
            std::string::npos);
}

}  // namespace
}  // namespace distckpt::internal_catalog
