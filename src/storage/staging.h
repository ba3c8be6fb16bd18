// Aligned staging memory for the I/O engine: a fixed set of slabs, reused across
// saves, touched once when created (first touch of fresh memory is expensive on
// shared VMs: seconds per GiB), handed out and returned by threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace distckpt::internal_storage {

class StagingPool {
 public:
  // `total_bytes` rounded down to whole slabs of `slab_bytes` (a multiple of
  // kDirectIoAlignment), at least 2 slabs so copying and writing can overlap.
  StagingPool(std::size_t total_bytes, std::size_t slab_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  std::size_t slab_bytes() const { return slab_bytes_; }
  std::size_t slab_count() const { return slabs_.size(); }
  std::size_t total_bytes() const { return slab_bytes_ * slabs_.size(); }

  // Blocks until a slab is free. Thread-safe.
  char* acquire();
  void release(char* slab);

 private:
  std::size_t slab_bytes_;
  std::vector<char*> slabs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
};

}  // namespace distckpt::internal_storage
