#include <algorithm>
#include <cstring>
#include <sstream>

#include "distckpt/layout.h"

namespace distckpt {

int64_t Box::num_elements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool Box::contains(const Box& inner) const {
  if (inner.shape.size() != shape.size()) return false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (inner.offset[d] < offset[d]) return false;
    if (inner.offset[d] + inner.shape[d] > offset[d] + shape[d]) return false;
  }
  return true;
}

std::string Box::to_string() const {
  std::ostringstream os;
  os << '[';
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d) os << ", ";
    os << offset[d] << ':' << offset[d] + shape[d];
  }
  os << ']';
  return os.str();
}

Box full_box(const Shape& global_shape) {
  return Box{Shape(global_shape.size(), 0), global_shape};
}

Box intersect(const Box& a, const Box& b) {
  Box r;
  const std::size_t n = a.shape.size();
  r.offset.resize(n);
  r.shape.resize(n);
  for (std::size_t d = 0; d < n; ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    r.offset[d] = lo;
    r.shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return r;
}

void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box,
              const Box& region, std::size_t elem_size) {
  const int n = static_cast<int>(region.shape.size());
  if (region.num_elements() == 0) return;
  if (n == 0) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // Merge the trailing dimensions that are whole in all three boxes into one
  // contiguous run, so typical slab copies become a single memcpy per row block.
  int k = n - 1;
  while (k > 0 && region.shape[k] == src_box.shape[k] && region.shape[k] == dst_box.shape[k]) --k;
  std::size_t run = elem_size;
  for (int d = k; d < n; ++d) run *= static_cast<std::size_t>(region.shape[d]);

  // Row-major strides (in bytes) of both buffers.
  std::vector<int64_t> sstride(n), dstride(n);
  int64_t s = static_cast<int64_t>(elem_size), t = static_cast<int64_t>(elem_size);
  for (int d = n - 1; d >= 0; --d) {
    sstride[d] = s;
    dstride[d] = t;
    s *= src_box.shape[d];
    t *= dst_box.shape[d];
  }
  int64_t soff = 0, doff = 0;
  for (int d = 0; d < n; ++d) {
    soff += (region.offset[d] - src_box.offset[d]) * sstride[d];
    doff += (region.offset[d] - dst_box.offset[d]) * dstride[d];
  }
  const auto* sp = static_cast<const unsigned char*>(src);
  auto* dp = static_cast<unsigned char*>(dst);
  // Odometer over dims [0, k).
  std::vector<int64_t> idx(k, 0);
  while (true) {
    std::memcpy(dp + doff, sp + soff, run);
    int d = k - 1;
    for (; d >= 0; --d) {
      soff += sstride[d];
      doff += dstride[d];
      if (++idx[d] < region.shape[d]) break;
      soff -= sstride[d] * region.shape[d];
      doff -= dstride[d] * region.shape[d];
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

}  // namespace distckpt
