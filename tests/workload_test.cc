// Tests of the benchmark workload (bench/workload.h) against shared/bench/WORKLOAD.md.
#include "workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

namespace distckpt::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

std::vector<WorkloadTensor> tensors_or_die(uint64_t size) {
  auto r = workload_tensors(size);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : std::vector<WorkloadTensor>{};
}

const WorkloadTensor* find(const std::vector<WorkloadTensor>& ts, const std::string& name) {
  for (const WorkloadTensor& t : ts) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---- values ----

TEST(WorkloadValue, ReferenceValuesSeed0Tid0) {
  const auto ts = tensors_or_die(64 * kMiB);
  ASSERT_GT(ts.size(), 5u);
  EXPECT_EQ(ts[0].name, "blocks.0.weight");
  EXPECT_EQ(ts[0].tid, 0);
  EXPECT_EQ(workload_value(0, 0, 0), 0.3048969507217407f);
  EXPECT_EQ(workload_value(0, 0, 1), 0.4024242162704468f);
  EXPECT_EQ(workload_value(0, 0, 2), -0.22575175762176514f);
  EXPECT_EQ(workload_value(0, 0, 3), 0.31282734870910645f);
  EXPECT_EQ(workload_value(0, 0, 1000), 0.2373943328857422f);

  // The same values through fill_slice: element 1000 of [1024, 4096] is row 0, col 1000.
  std::vector<float> row(1001);
  fill_slice(0, ts[0], Box{{0, 0}, {1, 1001}}, row.data());
  EXPECT_EQ(row[0], 0.3048969507217407f);
  EXPECT_EQ(row[3], 0.31282734870910645f);
  EXPECT_EQ(row[1000], 0.2373943328857422f);
}

TEST(WorkloadValue, ReferenceValuesSeed42Tid5) {
  const auto ts = tensors_or_die(64 * kMiB);
  ASSERT_GT(ts.size(), 5u);
  EXPECT_EQ(ts[5].name, "biases.0.out");
  EXPECT_EQ(ts[5].tid, 5);
  EXPECT_EQ(workload_value(42, 5, 0), 0.4458581209182739f);
  EXPECT_EQ(workload_value(42, 5, 1), 0.6111900806427002f);
  EXPECT_EQ(workload_value(42, 5, 2), 0.381081223487854f);
  float v[3];
  fill_slice(42, ts[5], Box{{0}, {3}}, v);
  EXPECT_EQ(v[0], 0.4458581209182739f);
  EXPECT_EQ(v[1], 0.6111900806427002f);
  EXPECT_EQ(v[2], 0.381081223487854f);
}

TEST(WorkloadValue, InRangeAndDependsOnSeedAndTid) {
  int differ_seed = 0, differ_tid = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const float v = workload_value(7, 3, i);
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
    differ_seed += v != workload_value(8, 3, i);
    differ_tid += v != workload_value(7, 4, i);
  }
  EXPECT_GT(differ_seed, 9900);
  EXPECT_GT(differ_tid, 9900);
}

// ---- tensor list ----

TEST(WorkloadTensors, OneGiB) {
  const auto ts = tensors_or_die(kGiB);
  EXPECT_EQ(ts.size(), 819u);
  EXPECT_EQ(workload_bytes(ts), 1'073'741'820ull);
  int large = 0, medium = 0, fill = 0, small = 0;
  for (const WorkloadTensor& t : ts) {
    if (t.shape == Shape{kHid, kHid}) {
      ++large;
    } else if (t.shape == Shape{kFfn, kHid}) {
      ++medium;
    } else if (t.name.ends_with("blocks.fill.weight")) {
      ++fill;
      EXPECT_EQ(t.shape, (Shape{181, kHid}));
    } else {
      ++small;
      EXPECT_EQ(t.shape.size(), 1u) << t.name;
    }
  }
  EXPECT_EQ(large, 6);
  EXPECT_EQ(medium, 39);
  EXPECT_EQ(fill, 3);
  EXPECT_EQ(small, 771);
  const WorkloadTensor* sf = find(ts, "small.fill");
  ASSERT_NE(sf, nullptr);
  EXPECT_EQ(sf->shape, (Shape{1365}));
  EXPECT_EQ(ts[0].name, "embed.weight");
  EXPECT_EQ(ts[1].name, "lm_head.weight");
  EXPECT_EQ(ts[2].name, "blocks.0.weight");
  EXPECT_EQ(ts[14].name, "blocks.12.weight");
  EXPECT_EQ(ts[15].name, "blocks.fill.weight");
  EXPECT_EQ(ts[16].name, "norms.0.weight");
  EXPECT_EQ(ts[17].name, "norms.0.bias");
  EXPECT_EQ(ts[18].name, "biases.0.in");
  EXPECT_EQ(ts[19].name, "biases.0.out");
  EXPECT_EQ(ts[272].name, "small.fill");
  EXPECT_EQ(ts[273].name, "optim.exp_avg.embed.weight");
  EXPECT_EQ(ts[546].name, "optim.exp_avg_sq.embed.weight");
  EXPECT_EQ(ts[818].name, "optim.exp_avg_sq.small.fill");
}

TEST(WorkloadTensors, OrderIdsAndMomentsInheritFromParameters) {
  const auto ts = tensors_or_die(kGiB);
  ASSERT_EQ(ts.size() % 3, 0u);
  const size_t np = ts.size() / 3;
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(ts[i].tid, static_cast<int>(i));
  for (size_t i = 0; i < np; ++i) {
    const WorkloadTensor& p = ts[i];
    EXPECT_FALSE(p.name.starts_with("optim."));
    EXPECT_EQ(ts[np + i].name, "optim.exp_avg." + p.name);
    EXPECT_EQ(ts[2 * np + i].name, "optim.exp_avg_sq." + p.name);
    for (const WorkloadTensor* m : {&ts[np + i], &ts[2 * np + i]}) {
      EXPECT_EQ(m->shape, p.shape);
      EXPECT_EQ(m->split_dim, p.split_dim);
    }
  }
}

TEST(WorkloadTensors, SplitDimAlternatesOverTwoDimensionalParameters) {
  for (uint64_t size : {64 * kMiB, 300 * kMiB, kGiB}) {
    const auto ts = tensors_or_die(size);
    const size_t np = ts.size() / 3;
    int two_d = 0;
    for (size_t i = 0; i < np; ++i) {
      if (ts[i].shape.size() == 2) {
        EXPECT_EQ(ts[i].split_dim, two_d % 2) << ts[i].name;
        ++two_d;
      } else {
        EXPECT_EQ(ts[i].split_dim, -1) << ts[i].name;
      }
    }
  }
  // At 64M: blocks.0.weight, blocks.fill.weight.
  const auto ts = tensors_or_die(64 * kMiB);
  EXPECT_EQ(ts[0].split_dim, 0);
  EXPECT_EQ(ts[1].name, "blocks.fill.weight");
  EXPECT_EQ(ts[1].split_dim, 1);
}

TEST(WorkloadTensors, LargeTierThresholds) {
  const uint64_t one_large = (kLarge + kSmall + 4 * kMedium) * 12;
  auto ts = tensors_or_die(one_large);
  ASSERT_FALSE(ts.empty());
  EXPECT_EQ(ts[0].name, "embed.weight");
  EXPECT_EQ(find(ts, "lm_head.weight"), nullptr);
  EXPECT_EQ(workload_bytes(ts), one_large);

  ts = tensors_or_die(one_large - 12);
  EXPECT_EQ(find(ts, "embed.weight"), nullptr);

  const uint64_t two_large = (2 * kLarge + kSmall + 4 * kMedium) * 12;
  ts = tensors_or_die(two_large);
  EXPECT_NE(find(ts, "lm_head.weight"), nullptr);
  EXPECT_EQ(workload_bytes(ts), two_large);
}

TEST(WorkloadTensors, SmallestSizeAndTooSmall) {
  auto ts = tensors_or_die(kSmall * 12);
  EXPECT_EQ(ts.size(), 3u * 4 * kGroups);  // only norms and biases
  EXPECT_EQ(workload_bytes(ts), static_cast<uint64_t>(kSmall) * 12);

  auto r = workload_tensors(kSmall * 12 - 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(workload_tensors(0).ok());
}

TEST(WorkloadTensors, TotalBytesIsSizeRoundedDownToTwelve) {
  for (uint64_t size : {8 * kMiB, 64 * kMiB + 5, 256 * kMiB, 3 * kGiB}) {
    EXPECT_EQ(workload_bytes(tensors_or_die(size)), size / 12 * 12) << size;
  }
}

// ---- parse_size ----

TEST(ParseSize, Accepts) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"0", 0},           {"12345", 12345},        {"64K", 64 * 1024},  {"64k", 64 * 1024},
      {"256M", 256 * kMiB}, {"1G", kGiB},          {"2g", 2 * kGiB},    {"1GiB", kGiB},
      {"10MB", 10 * kMiB}, {"100B", 100},           {"16384G", 16384 * kGiB},
  };
  for (const auto& [text, want] : cases) {
    auto r = parse_size(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(*r, want) << text;
  }
}

TEST(ParseSize, Rejects) {
  for (const char* text : {"", "M", "-1", "12X", "1.5G", " 1G", "1G ", "1GG", "1T", "0x10",
                           "99999999999999999999", "17179869184G"}) {
    auto r = parse_size(text);
    EXPECT_FALSE(r.ok()) << "'" << text << "' parsed as " << (r.ok() ? *r : 0);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
    }
  }
}

// ---- layouts ----

TEST(WorkloadLayout, DeviceMatrixWhenTpDivides) {
  const auto ts = tensors_or_die(64 * kMiB);
  const WorkloadTensor& rows = ts[0];   // [1024, 4096], split 0
  const WorkloadTensor& cols = ts[1];   // [181, 4096], split 1
  const WorkloadTensor& vec = ts[2];    // [4096]
  ASSERT_EQ(rows.split_dim, 0);
  ASSERT_EQ(cols.split_dim, 1);
  ASSERT_EQ(vec.split_dim, -1);

  auto l = workload_layout(rows, 2, 2);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_TRUE(l->is_device_matrix());
  EXPECT_EQ(l->dev_mat(), (Shape{2, 2}));
  EXPECT_EQ(l->tensor_map(), (Shape{0, -1}));
  EXPECT_EQ(l->slice_box(0), (Box{{0, 0}, {512, kHid}}));
  EXPECT_EQ(l->slice_box(1), (Box{{512, 0}, {512, kHid}}));
  EXPECT_EQ(l->slice_box(2), l->slice_box(0));  // dp replica
  EXPECT_EQ(l->slice_box(3), l->slice_box(1));

  l = workload_layout(cols, 2, 2);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->tensor_map(), (Shape{-1, 0}));
  EXPECT_EQ(l->slice_box(1), (Box{{0, 2048}, {181, 2048}}));

  l = workload_layout(vec, 2, 2);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->tensor_map(), (Shape{-1}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(l->slice_box(r), full_box(vec.shape));

  EXPECT_FALSE(workload_layout(rows, 0, 2).ok());
  EXPECT_FALSE(workload_layout(rows, 2, 0).ok());
}

TEST(WorkloadLayout, IrregularSplitCoversTensorExactly) {
  const int dp = 2, tp = 3;
  const auto ts = tensors_or_die(64 * kMiB);
  int checked = 0;
  for (const WorkloadTensor& t : ts) {
    if (t.split_dim < 0 || t.tid > 1) continue;  // blocks.0.weight (rows), blocks.fill.weight (cols)
    const size_t sd = static_cast<size_t>(t.split_dim);
    const int64_t d = t.shape[sd];
    ASSERT_NE(d % tp, 0) << t.name;
    auto l = workload_layout(t, dp, tp);
    ASSERT_TRUE(l.ok()) << t.name << ": " << l.status().to_string();
    EXPECT_FALSE(l->is_device_matrix());
    EXPECT_EQ(l->global_shape(), t.shape);
    int64_t covered = 0, next = 0;
    for (int i = 0; i < tp; ++i) {
      const auto boxes = l->boxes_of(i);
      ASSERT_EQ(boxes.size(), 1u);
      const Box& b = boxes[0];
      for (int j = 1; j < dp; ++j) EXPECT_EQ(l->boxes_of(j * tp + i), boxes) << "dp replica";
      EXPECT_EQ(b.offset[sd], next);                 // parts are adjacent, in order
      EXPECT_EQ(b.offset[sd], i * d / tp);
      EXPECT_EQ(b.shape[sd], (i + 1) * d / tp - i * d / tp);
      EXPECT_EQ(b.offset[1 - sd], 0);                // the other dimension is whole
      EXPECT_EQ(b.shape[1 - sd], t.shape[1 - sd]);
      next = b.offset[sd] + b.shape[sd];
      covered += b.num_elements();
    }
    EXPECT_EQ(next, d);
    EXPECT_EQ(covered, t.num_elements());
    EXPECT_TRUE(l->boxes_of(dp * tp).empty());  // not a member
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// ---- fill_slice / check_slice ----

TEST(FillCheck, SubBoxMatchesGlobalIndex) {
  const auto ts = tensors_or_die(64 * kMiB);
  const WorkloadTensor& t = ts[1];  // [181, 4096]
  const Box box{{5, 100}, {7, 33}};
  std::vector<float> buf(7 * 33);
  fill_slice(9, t, box, buf.data());
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t c = 0; c < 33; ++c) {
      const uint64_t gi = static_cast<uint64_t>((5 + r) * kHid + 100 + c);
      ASSERT_EQ(buf[r * 33 + c], workload_value(9, t.tid, gi)) << r << "," << c;
    }
  }
  EXPECT_EQ(check_slice(9, t, box, buf.data()), 0u);
}

TEST(FillCheck, DetectsMismatches) {
  const auto ts = tensors_or_die(64 * kMiB);
  for (const WorkloadTensor* t : {&ts[0], &ts[5]}) {
    const Box box = t->shape.size() == 2 ? Box{{3, 0}, {2, kHid}} : Box{{10}, {500}};
    std::vector<float> buf(static_cast<size_t>(box.num_elements()));
    fill_slice(1, *t, box, buf.data());
    EXPECT_EQ(check_slice(1, *t, box, buf.data()), 0u);

    // One flipped bit.
    uint32_t bits;
    std::memcpy(&bits, &buf[17], 4);
    bits ^= 1u;
    std::memcpy(&buf[17], &bits, 4);
    EXPECT_EQ(check_slice(1, *t, box, buf.data()), 1u);

    // +0.0 vs -0.0 differ bitwise; zeroed buffers fail everywhere.
    std::fill(buf.begin(), buf.end(), 0.0f);
    EXPECT_EQ(check_slice(1, *t, box, buf.data()), buf.size());

    // Wrong seed: (almost) everything differs.
    fill_slice(2, *t, box, buf.data());
    EXPECT_GT(check_slice(1, *t, box, buf.data()), buf.size() * 9 / 10);
  }
}

TEST(FillCheck, WholeTensorAndEmptyBox) {
  const auto ts = tensors_or_die(64 * kMiB);
  const WorkloadTensor& t = ts[2];  // norms.0.weight [4096]
  std::vector<float> buf(kHid);
  fill_slice(0, t, full_box(t.shape), buf.data());
  EXPECT_EQ(buf[123], workload_value(0, t.tid, 123));
  EXPECT_EQ(check_slice(0, t, full_box(t.shape), buf.data()), 0u);
  float sentinel = 42.0f;
  fill_slice(0, ts[0], Box{{0, 0}, {0, kHid}}, &sentinel);  // writes nothing
  EXPECT_EQ(sentinel, 42.0f);
  EXPECT_EQ(check_slice(0, ts[0], Box{{0, 0}, {0, kHid}}, &sentinel), 0u);
}

}  // namespace
}  // namespace distckpt::bench
