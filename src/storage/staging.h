// Aligned staging memory for the I/O engine: slabs reused across saves, each touched
// once, when it is made or by its first use (FirstTouch: first touch of fresh memory is
// expensive on shared VMs, seconds per GiB), handed out and returned by threads. A
// growing pool starts with 2 slabs and makes more only when every slab is in use, up to
// its size: a rank that stages little never holds the whole budget.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace distckpt::internal_storage {

class StagingPool {
 public:
  // When a slab's pages are first touched. kNow: as it is made (an async save's copy is
  // what the training loop waits for, so its faults are taken before). kOnUse: by the
  // first copy into it; a synchronous direct-I/O save copies into one slab while the disk
  // writes another, so the faults hide behind the writes, where touching 32 MiB up front
  // cost 17 ms per rank before the first write (35-45 ms of a 0.19 s save at 256 MiB,
  // 4 ranks on 2 cores).
  enum class FirstTouch { kNow, kOnUse };
  // `total_bytes` rounded down to whole slabs of `slab_bytes` (a multiple of
  // kDirectIoAlignment), at least 2 slabs so copying and writing can overlap; all made
  // now, or (`grow`) 2 now and the others as acquire() needs them. std::bad_alloc when
  // the first ones cannot be allocated.
  StagingPool(std::size_t total_bytes, std::size_t slab_bytes, bool grow = false,
              FirstTouch touch = FirstTouch::kNow);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  std::size_t slab_bytes() const { return slab_bytes_; }
  std::size_t max_slab_count() const;  // Thread-safe.
  // Slabs made so far (what the pool holds in memory). Thread-safe.
  std::size_t slab_count() const;

  // A free slab; with none free, a new one while the pool may grow (and memory can be
  // had), else waits until one is released. Thread-safe.
  char* acquire();
  // As acquire(), but null instead of waiting when no slab is free and the pool cannot
  // grow. Thread-safe.
  char* try_acquire();
  void release(char* slab);

 private:
  char* make_slab() const;  // aligned (2 MiB pages where whole ones fit), or null
  void unmake_slab(char* slab) const;
  char* take(bool wait);

  std::size_t slab_bytes_;
  std::size_t max_count_;
  FirstTouch touch_;
  std::size_t making_ = 0;  // slabs being made outside the lock
  std::vector<char*> slabs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
};

}  // namespace distckpt::internal_storage
