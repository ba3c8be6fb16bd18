#include "workload.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <limits>

namespace distckpt::bench {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t tensor_state(uint64_t seed, int tid) {
  return mix64(seed ^ ((static_cast<uint64_t>(tid) + 1) * kGolden));
}

// (m >> 40) * 2^-23 - 1.0 computed exactly in float: the 24-bit integer minus 2^23 fits
// a float's mantissa, and the scaling is a power of two.
inline float to_value(uint64_t m) {
  const int32_t k = static_cast<int32_t>(m >> 40) - (int32_t{1} << 23);
  return static_cast<float>(k) * 0x1p-23f;
}

// Values of global elements [first, first + n) of the tensor whose state is `state`.
inline void gen_row(uint64_t state, uint64_t first, int64_t n, float* out) {
  uint64_t x = state + (first + 1) * kGolden;
  for (int64_t k = 0; k < n; ++k) {
    out[k] = to_value(mix64(x));
    x += kGolden;
  }
}

inline uint64_t check_row(uint64_t state, uint64_t first, int64_t n, const float* data) {
  uint64_t x = state + (first + 1) * kGolden;
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    bad += std::bit_cast<uint32_t>(to_value(mix64(x))) != std::bit_cast<uint32_t>(data[k]);
    x += kGolden;
  }
  return bad;
}

// Calls row(global_first_index, row_length, position_in_box) for every contiguous row of
// `box` (the last dimension), in row-major order over the box.
template <typename RowFn>
void for_each_row(const Shape& global, const Box& box, RowFn&& row) {
  const size_t rank = global.size();
  for (int64_t extent : box.shape) {
    if (extent == 0) return;
  }
  if (rank == 0) {
    row(uint64_t{0}, int64_t{1}, int64_t{0});
    return;
  }
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * global[d];
  const int64_t len = box.shape[rank - 1];
  std::vector<int64_t> pos(rank, 0);  // position inside the box; last entry stays 0
  int64_t out = 0;
  while (true) {
    int64_t first = 0;
    for (size_t d = 0; d < rank; ++d) first += (box.offset[d] + pos[d]) * stride[d];
    row(static_cast<uint64_t>(first), len, out);
    out += len;
    if (rank == 1) return;
    size_t d = rank - 1;  // odometer over the outer dimensions
    while (d > 0) {
      --d;
      if (++pos[d] < box.shape[d]) break;
      pos[d] = 0;
      if (d == 0) return;
    }
  }
}

}  // namespace

Result<uint64_t> parse_size(std::string text) {
  const std::string orig = text;
  auto bad = [&orig](const char* why) {
    return invalid_argument("parse_size: '" + orig + "': " + why +
                            " (expected bytes with an optional K/M/G suffix, e.g. 256M)");
  };
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return bad("too large");
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return bad("no digits");
  std::string suffix = text.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!suffix.empty() && (suffix[0] == 'K' || suffix[0] == 'M' || suffix[0] == 'G')) {
    shift = suffix[0] == 'K' ? 10 : suffix[0] == 'M' ? 20 : 30;
    suffix.erase(0, 1);
    if (suffix == "IB") suffix = "B";
  }
  if (!suffix.empty() && suffix != "B") return bad("unknown suffix");
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) return bad("too large");
  return value << shift;
}

int64_t WorkloadTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<WorkloadTensor>> workload_tensors(uint64_t size_bytes) {
  const uint64_t n_u = size_bytes / 12;
  if (n_u < static_cast<uint64_t>(kSmall)) {
    return invalid_argument("workload: size " + std::to_string(size_bytes) + " bytes gives " +
                            std::to_string(n_u) + " elements per copy, fewer than the " +
                            std::to_string(kSmall) + " of the small tensors (need at least " +
                            std::to_string(kSmall * 12) + " bytes)");
  }
  if (n_u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 4)) {
    return invalid_argument("workload: size " + std::to_string(size_bytes) + " is too large");
  }
  const int64_t n = static_cast<int64_t>(n_u);
  int n_large = 0;
  if (n >= 2 * kLarge + kSmall + 4 * kMedium) {
    n_large = 2;
  } else if (n >= kLarge + kSmall + 4 * kMedium) {
    n_large = 1;
  }
  int64_t rem = n - n_large * kLarge - kSmall;
  const int64_t n_med = rem / kMedium;
  rem %= kMedium;
  const int64_t fill_rows = rem / kHid;
  const int64_t fill_small = rem % kHid;

  std::vector<WorkloadTensor> params;
  int two_d = 0;
  auto add = [&](std::string name, Shape shape) {
    WorkloadTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.split_dim = t.shape.size() == 2 ? (two_d++ % 2) : -1;
    params.push_back(std::move(t));
  };
  const char* large_names[2] = {"embed.weight", "lm_head.weight"};
  for (int j = 0; j < n_large; ++j) add(large_names[j], {kHid, kHid});
  for (int64_t j = 0; j < n_med; ++j) add("blocks." + std::to_string(j) + ".weight", {kFfn, kHid});
  if (fill_rows > 0) add("blocks.fill.weight", {fill_rows, kHid});
  for (int64_t k = 0; k < kGroups; ++k) {
    const std::string g = std::to_string(k);
    add("norms." + g + ".weight", {kHid});
    add("norms." + g + ".bias", {kHid});
    add("biases." + g + ".in", {kFfn});
    add("biases." + g + ".out", {kFfn});
  }
  if (fill_small > 0) add("small.fill", {fill_small});

  std::vector<WorkloadTensor> all;
  all.reserve(params.size() * 3);
  for (const char* prefix : {"", "optim.exp_avg.", "optim.exp_avg_sq."}) {
    for (const WorkloadTensor& p : params) {
      WorkloadTensor t = p;
      t.name = prefix + p.name;
      t.tid = static_cast<int>(all.size());
      all.push_back(std::move(t));
    }
  }
  return all;
}

uint64_t workload_bytes(const std::vector<WorkloadTensor>& tensors) {
  uint64_t total = 0;
  for (const WorkloadTensor& t : tensors) total += static_cast<uint64_t>(t.num_elements()) * 4;
  return total;
}

float workload_value(uint64_t seed, int tid, uint64_t i) {
  return to_value(mix64(tensor_state(seed, tid) + (i + 1) * kGolden));
}

Result<TensorLayout> workload_layout(const WorkloadTensor& t, int dp, int tp) {
  if (dp < 1 || tp < 1) {
    return invalid_argument("workload_layout: tensor '" + t.name + "': dp=" + std::to_string(dp) +
                            " tp=" + std::to_string(tp) + " (both must be >= 1)");
  }
  const Shape dev_mat = {dp, tp};
  if (t.split_dim < 0) return TensorLayout::from_device_matrix(t.shape, dev_mat, Shape(t.shape.size(), -1));
  const size_t sd = static_cast<size_t>(t.split_dim);
  if (t.shape.size() != 2 || sd > 1) {
    return invalid_argument("workload_layout: tensor '" + t.name + "': split_dim " +
                            std::to_string(t.split_dim) + " on a " +
                            std::to_string(t.shape.size()) + "-d tensor");
  }
  const int64_t d = t.shape[sd];
  if (d % tp == 0) {
    const Shape tensor_map = sd == 0 ? Shape{0, -1} : Shape{-1, 0};
    return TensorLayout::from_device_matrix(t.shape, dev_mat, tensor_map);
  }
  // Irregular split: part i = [i*d/tp, (i+1)*d/tp); DP ranks hold identical boxes.
  std::vector<std::vector<Box>> boxes(static_cast<size_t>(dp) * tp);
  for (int rank = 0; rank < dp * tp; ++rank) {
    const int64_t i = rank % tp;
    Box b{Shape(2, 0), t.shape};
    b.offset[sd] = i * d / tp;
    b.shape[sd] = (i + 1) * d / tp - i * d / tp;
    boxes[rank].push_back(std::move(b));
  }
  return TensorLayout::from_boxes(t.shape, std::move(boxes));
}

void fill_slice(uint64_t seed, const WorkloadTensor& t, const Box& box, float* out) {
  const uint64_t state = tensor_state(seed, t.tid);
  for_each_row(t.shape, box, [&](uint64_t first, int64_t len, int64_t pos) {
    gen_row(state, first, len, out + pos);
  });
}

uint64_t check_slice(uint64_t seed, const WorkloadTensor& t, const Box& box, const float* data) {
  const uint64_t state = tensor_state(seed, t.tid);
  uint64_t bad = 0;
  for_each_row(t.shape, box, [&](uint64_t first, int64_t len, int64_t pos) {
    bad += check_row(state, first, len, data + pos);
  });
  return bad;
}

}  // namespace distckpt::bench
