// Object roots on an in-memory store with S3's conditions (storage/object_store.h): the
// file system of s3:// paths, the commit by a conditional create, `latest` and the commit
// counter by compare-and-swap, the start-up probe, and the root lock. The same protocol
// against a real Ceph RGW: tests/s3/.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "catalog/gc.h"
#include "catalog/object_root.h"
#include "distckpt/checkpoint.h"
#include "distckpt/inspect.h"
#include "distckpt/tier.h"
#include "format/native/index_codec.h"
#include "local_ranks.h"
#include "storage/object_fs.h"
#include "storage/s3_store.h"

namespace distckpt {
namespace {

using internal_storage::memory_object_store;
using internal_storage::ObjectStore;
using internal_storage::register_object_store;

// A bucket of its own per test, served from memory behind s3:// names.
std::shared_ptr<ObjectStore> fresh_bucket(const std::string& bucket, bool enforce = true) {
  auto store = memory_object_store(bucket, 5u << 20, enforce);
  register_object_store(bucket, store);
  return store;
}

struct Tensors {
  std::vector<float> weight;
  StateDict state;
  Tensors(int rank, int world, float base) : weight(64), state(rank) {
    for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = base + static_cast<float>(rank * 64 + i);
    auto layout = TensorLayout::from_device_matrix({64 * static_cast<int64_t>(world)}, {world}, {0});
    EXPECT_TRUE(state.add_tensor("w", DType::kFloat32, weight.data(), *layout).ok());
  }
};

TEST(ObjectFileSystem, WritesAnObjectWholeInPartsAndReadsItBack) {
  auto store = fresh_bucket("objfs-parts");
  auto fs = internal_storage::object_filesystem();
  std::string bytes(12 << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  auto file = fs->open_writable("s3://objfs-parts/a/b.bin");
  ASSERT_TRUE(file.ok());
  // Out of order: the second half first, then the first.
  const std::size_t half = bytes.size() / 2;
  ASSERT_TRUE((*file)->write_at(bytes.data() + half, bytes.size() - half, half).ok());
  EXPECT_FALSE(fs->exists("s3://objfs-parts/a/b.bin"));
  ASSERT_TRUE((*file)->write_at(bytes.data(), half, 0).ok());
  EXPECT_FALSE(fs->exists("s3://objfs-parts/a/b.bin")) << "visible before it was complete";
  // Bytes already sent cannot be rewritten.
  EXPECT_FALSE((*file)->write_at(bytes.data(), 16, 0).ok());
  ASSERT_TRUE((*file)->sync().ok());
  ASSERT_TRUE((*file)->close().ok());
  auto read = fs->open_readable("s3://objfs-parts/a/b.bin");
  ASSERT_TRUE(read.ok());
  std::string back(bytes.size(), '\0');
  ASSERT_TRUE((*read)->read_at(back.data(), back.size(), 0).ok());
  EXPECT_TRUE(back == bytes);
  char small[100];
  ASSERT_TRUE((*read)->read_at(small, sizeof(small), 5 << 20).ok());
  EXPECT_EQ(std::memcmp(small, bytes.data() + (5 << 20), sizeof(small)), 0);
  EXPECT_EQ((*read)->read_at(small, sizeof(small), bytes.size() - 50).code(), StatusCode::kCorruption);
  // Directories are prefixes; rename and atomic mkdir are refused, never emulated.
  auto listing = fs->list_dir("s3://objfs-parts/a");
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 1u);
  EXPECT_EQ((*listing)[0].name, "b.bin");
  EXPECT_EQ(fs->rename("s3://objfs-parts/a/b.bin", "s3://objfs-parts/a/c.bin").code(), StatusCode::kUnsupported);
  EXPECT_EQ(fs->create_dir("s3://objfs-parts/d").code(), StatusCode::kUnsupported);
  EXPECT_EQ(fs->append_synced("s3://objfs-parts/a/b.bin", "x").code(), StatusCode::kUnsupported);
  // A reader holds one version: a rewrite makes its reads fail rather than mix versions.
  ASSERT_TRUE(store->put("a/b.bin", "new", {}).ok());
  EXPECT_EQ((*read)->read_at(small, sizeof(small), 0).code(), StatusCode::kAborted);
}

TEST(ObjectRoot, SavesLoadsAndListsThroughS3Names) {
  fresh_bucket("objroot-save");
  const std::string root = "s3://objroot-save/jobs/run";
  testing::expect_all_ok(testing::run_ranks(2, [&](Comm& comm) -> Status {
    for (int step : {1, 2}) {
      Tensors t(comm.rank(), comm.size(), static_cast<float>(step * 1000));
      SaveOptions o;
      o.step = step;
      o.name = "step-" + std::to_string(step);
      DISTCKPT_RETURN_IF_ERROR(save(comm, t.state, root, o).status());
    }
    Tensors back(comm.rank(), comm.size(), -1);
    DISTCKPT_RETURN_IF_ERROR(load(comm, back.state, root, {}).status());  // the newest
    Tensors want(comm.rank(), comm.size(), 2000);
    if (back.weight != want.weight) return internal_error("loaded bytes differ");
    return Status();
  }));
  auto listing = list_checkpoints(root);
  ASSERT_TRUE(listing.ok()) << listing.status().to_string();
  ASSERT_EQ(listing->entries.size(), 2u);
  EXPECT_EQ(listing->latest, "step-2");
  for (const auto& e : listing->entries) EXPECT_EQ(e.state, EntryState::kCommitted) << e.name << ": " << e.detail;
  // Data objects lie under the save's own prefix, which the index names.
  auto info = read_checkpoint_info(root + "/step-2");
  ASSERT_TRUE(info.ok());
  for (const auto& f : info->files) EXPECT_TRUE(f.name.rfind("s-", 0) == 0) << f.name;
  ASSERT_TRUE(remove_checkpoint(root, "step-1").ok());
  listing = list_checkpoints(root);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 1u);
  EXPECT_EQ(listing->entries[0].name, "step-2");
}

TEST(ObjectRoot, WhatNeedsAFileSystemRootIsRefused) {
  fresh_bucket("objroot-refused");
  const std::string root = "s3://objroot-refused/r";
  const std::string local = ::testing::TempDir() + "objroot-tier-{host}";
  testing::expect_all_ok(testing::run_ranks(2, [&](Comm& comm) -> Status {
    Tensors t(comm.rank(), comm.size(), 1);
    SaveOptions o;
    o.name = "a";
    auto tier = save_local(comm, t.state, root, o, LocalTier{local, "auto"});
    if (tier.status().code() != StatusCode::kUnsupported) return internal_error("tier: " + tier.status().to_string());
    o.format = Format::kSafetensors;
    auto single = save(comm, t.state, root, o);
    if (single.status().code() != StatusCode::kUnsupported) return internal_error("single: " + single.status().to_string());
    o.format = Format::kNative;
    o.incremental = true;
    auto incremental = save(comm, t.state, root, o);
    if (incremental.status().code() != StatusCode::kInvalidArgument)
      return internal_error("incremental: " + incremental.status().to_string());
    return Status();
  }));
  auto listing = list_checkpoints(root);
  ASSERT_TRUE(listing.ok());
  EXPECT_TRUE(listing->entries.empty());
}

TEST(ObjectRoot, TwoSavesOfOneNameCommitOnceAndTheLoserLeavesNothing) {
  auto store = fresh_bucket("objroot-race");
  const std::string root = "s3://objroot-race/r";
  // Two saves interleaved up to their commit: both began (each its own s-<id>/), both
  // wrote; the first create of the index wins, the second is refused and cleans up.
  internal_catalog::Entry a, b;
  auto fs = internal_storage::object_filesystem();
  auto ea = internal_catalog::begin_object_entry(*fs, root, "ck", "a", nullptr);
  auto eb = internal_catalog::begin_object_entry(*fs, root, "ck", "b", nullptr);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_NE(ea->tmp, eb->tmp);
  EXPECT_NE(ea->commit_seq, eb->commit_seq);
  for (const auto* e : {&*ea, &*eb}) ASSERT_TRUE(write_file_synced(*fs, e->tmp + "/data-00000.bin", e->tmp).ok());
  proto::Index index;
  index.set_name("ck");
  index.set_world_size(1);
  auto* f = index.add_files();
  f->set_name(ea->data_dir + "/data-00000.bin");
  f->set_size(ea->tmp.size());
  ASSERT_TRUE(internal_catalog::commit_object_entry(*fs, *ea, index, true).ok());
  f->set_name(eb->data_dir + "/data-00000.bin");
  auto lost = internal_catalog::commit_object_entry(*fs, *eb, index, true);
  EXPECT_EQ(lost.status().code(), StatusCode::kAlreadyExists) << lost.status().to_string();
  auto objects = store->list("r/ck/");
  ASSERT_TRUE(objects.ok());
  for (const auto& [key, info] : objects->objects) EXPECT_EQ(key.find(eb->data_dir), std::string::npos) << key;
}

TEST(ObjectRoot, CounterAndLatestMoveOnlyForwardUnderRacingWriters) {
  auto store = fresh_bucket("objroot-cas");
  const std::string root = "s3://objroot-cas/r";
  std::mutex mu;
  std::set<uint64_t> numbers;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto n = internal_catalog::claim_object_seq(*store, root);
        ASSERT_TRUE(n.ok()) << n.status().to_string();
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(numbers.insert(*n).second) << "number " << *n << " handed out twice";
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(numbers.size(), 100u);
  EXPECT_EQ(*numbers.rbegin(), 100u);
  // `latest` never goes back to a checkpoint with a lower commit number.
  for (uint64_t seq : {5, 9}) {
    proto::Index index;
    index.set_name("c" + std::to_string(seq));
    index.set_world_size(1);
    index.set_commit_seq(seq);
    ASSERT_TRUE(store->put("r/c" + std::to_string(seq) + "/index.pb", internal_format::frame_index(index), {}).ok());
  }
  ASSERT_TRUE(internal_catalog::move_object_latest(*store, root, "c9", 9).ok());
  ASSERT_TRUE(internal_catalog::move_object_latest(*store, root, "c5", 5).ok());
  EXPECT_EQ(*store->get("r/latest"), "c9\n");
}

TEST(ObjectRoot, AStoreIgnoringConditionsIsRefusedUnlessUnsafeIsAsked) {
  fresh_bucket("objroot-lax", /*enforce=*/false);
  Status st = internal_catalog::probe_object_root("s3://objroot-lax/r");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("If-None-Match"), std::string::npos) << st.to_string();
  testing::expect_all_ok(testing::run_ranks(1, [&](Comm& comm) -> Status {
    Tensors t(comm.rank(), comm.size(), 1);
    SaveOptions o;
    o.name = "x";
    auto saved = save(comm, t.state, "s3://objroot-lax/r", o);
    return saved.status().code() == StatusCode::kUnsupported ? Status() : internal_error(saved.status().to_string());
  }));
  setenv("DISTCKPT_S3_UNSAFE_NO_CONDITIONS", "1", 1);
  EXPECT_TRUE(internal_catalog::probe_object_root("s3://objroot-lax/r2").ok());
  unsetenv("DISTCKPT_S3_UNSAFE_NO_CONDITIONS");
}

TEST(ObjectRoot, IncompleteUploadsAreAbortedByGcAndWithTheirPrefix) {
  auto store = fresh_bucket("objroot-uploads");
  // A writer killed mid-object leaves an upload nobody completes.
  auto killed = store->start_upload("r/a/s-0123456789abcdef/data-00000.bin");
  ASSERT_TRUE(killed.ok());
  ASSERT_TRUE((*killed)->upload_part(1, std::string(100, 'x')).ok());
  ASSERT_EQ(store->list_uploads("r/")->size(), 1u);
  auto young = internal_catalog::abort_stale_uploads("s3://objroot-uploads/r", 3600, false);
  ASSERT_TRUE(young.ok());
  EXPECT_TRUE(young->empty()) << "an upload within the lease was aborted";
  auto old = internal_catalog::abort_stale_uploads("s3://objroot-uploads/r", 0, false);
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  ASSERT_EQ(old->size(), 1u);
  EXPECT_NE((*old)[0].name.find("a/s-0123456789abcdef/data-00000.bin"), std::string::npos) << (*old)[0].name;
  EXPECT_TRUE(store->list_uploads("r/")->empty());
  EXPECT_FALSE((*killed)->complete(1).ok()) << "an aborted upload completed";
  // Removing a prefix aborts the uploads under it too.
  auto under = store->start_upload("r/b/s-fedcba9876543210/data-00001.bin");
  ASSERT_TRUE(under.ok());
  ASSERT_TRUE(internal_storage::object_filesystem()->remove_all("s3://objroot-uploads/r/b").ok());
  EXPECT_TRUE(store->list_uploads("r/")->empty());
}

TEST(ObjectRoot, ALockHasOneHolderAndASilentOneIsBrokenOnce) {
  auto store = fresh_bucket("objroot-lock");
  const std::string root = "s3://objroot-lock/r";
  auto first = internal_catalog::ObjectRootLock::acquire(store, root, "x", 5, 2);
  ASSERT_TRUE(first.ok());
  // Held and beating: a waiter gives up (its silence is never reached).
  auto second = internal_catalog::ObjectRootLock::acquire(store, root, "x", 3, 2);
  EXPECT_EQ(second.status().code(), StatusCode::kAborted);
  first->reset();  // released by a "free" record: taken at once
  auto third = internal_catalog::ObjectRootLock::acquire(store, root, "x", 1, 2);
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_TRUE((*third)->still_held().ok());
  // A holder that went silent (its record is frozen here by hand: a stopped process) is
  // broken by exactly one of two racing waiters, and learns it lost the lock.
  ASSERT_TRUE(store->put("r/.distckpt/locks/x", "held by a stopped process\n", {}).ok());
  std::atomic<int> won{0};
  std::vector<std::thread> waiters;
  std::vector<std::unique_ptr<internal_catalog::ObjectRootLock>> held(2);
  for (int w = 0; w < 2; ++w)
    waiters.emplace_back([&, w] {
      auto got = internal_catalog::ObjectRootLock::acquire(store, root, "x", 4, 1.5);
      if (got.ok()) ++won, held[static_cast<std::size_t>(w)] = std::move(*got);
    });
  for (auto& t : waiters) t.join();
  EXPECT_EQ(won.load(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the old holder's next beat
  EXPECT_EQ((*third)->still_held().code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace distckpt
