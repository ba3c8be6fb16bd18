#include "storage/staging.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "distckpt/filesystem.h"

namespace distckpt::internal_storage {

StagingPool::StagingPool(std::size_t total_bytes, std::size_t slab_bytes)
    : slab_bytes_((slab_bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment) {
  const std::size_t count = std::max<std::size_t>(2, total_bytes / slab_bytes_);
  for (std::size_t i = 0; i < count; ++i) {
    char* slab = static_cast<char*>(std::aligned_alloc(kDirectIoAlignment, slab_bytes_));
    if (slab == nullptr) {
      for (char* s : slabs_) std::free(s);
      throw std::bad_alloc();
    }
    std::memset(slab, 0, slab_bytes_);  // first touch now, not during a save
    slabs_.push_back(slab);
  }
  free_ = slabs_;
}

StagingPool::~StagingPool() {
  for (char* s : slabs_) std::free(s);
}

char* StagingPool::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  char* slab = free_.back();
  free_.pop_back();
  return slab;
}

void StagingPool::release(char* slab) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slab);
  }
  cv_.notify_one();
}

}  // namespace distckpt::internal_storage
