#include "storage/staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "distckpt/filesystem.h"

namespace distckpt::internal_storage {

StagingPool::StagingPool(std::size_t total_bytes, std::size_t slab_bytes, bool grow)
    : slab_bytes_((slab_bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment),
      max_count_(std::max<std::size_t>(2, total_bytes / slab_bytes_)) {
  const std::size_t count = grow ? 2 : max_count_;
  for (std::size_t i = 0; i < count; ++i) {
    char* slab = make_slab();
    if (slab == nullptr) {
      for (char* s : slabs_) std::free(s);
      throw std::bad_alloc();
    }
    slabs_.push_back(slab);
  }
  free_ = slabs_;
}

StagingPool::~StagingPool() {
  for (char* s : slabs_) std::free(s);
}

char* StagingPool::make_slab() const {
  char* slab = static_cast<char*>(std::aligned_alloc(kDirectIoAlignment, slab_bytes_));
  if (slab != nullptr) std::memset(slab, 0, slab_bytes_);  // first touch now, not while copying into it
  return slab;
}

std::size_t StagingPool::max_slab_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_count_;
}

std::size_t StagingPool::slab_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slabs_.size();
}

char* StagingPool::acquire() { return take(true); }

char* StagingPool::try_acquire() { return take(false); }

char* StagingPool::take(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (free_.empty() && slabs_.size() + making_ < max_count_) {
    ++making_;
    lock.unlock();
    char* slab = make_slab();
    lock.lock();
    --making_;
    if (slab != nullptr) {
      slabs_.push_back(slab);
      return slab;
    }
    max_count_ = slabs_.size();  // no more memory to be had: make do with what there is
  }
  if (!wait && free_.empty()) return nullptr;
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
