// train_mlp: a real data- and tensor-parallel MLP trained with SGD + momentum, with
// periodic distckpt checkpoints, a simulated crash and exact resume.
//
//   mpirun -np 4 train_mlp --dp 2 --tp 2 --steps 50 --save-every 10 --dir /tmp/ckpt
//   mpirun -np 4 train_mlp --dp 2 --tp 2 --steps 50 --save-every 10 --dir /tmp/ckpt --resume
//
// Ranks form a dp x tp grid: rank = dp_index * tp + tp_index. The model is a two-layer
// MLP split Megatron-style over the TP ranks of a DP replica:
//   fc1: W1 [hidden, in] column-parallel (rows split over TP), b1 [hidden] split alike;
//   fc2: W2 [out, hidden] row-parallel (columns split over TP), b2 [out] replicated.
// Everything that affects training (initial weights, data) is a pure function of
// tensor names, global indices and the step number, so a run resumed from a
// checkpoint follows exactly the same trajectory as an uninterrupted one. The
// layout-independent fingerprint printed by rank 0 makes that checkable.

#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/distckpt.h"

namespace {

struct Config {
  int dp = 1, tp = 1;
  int64_t steps = 50, save_every = 10, crash_at_step = -1;
  std::string dir;
  bool resume = false;
  std::string resume_from;  // a checkpoint name under --dir (e.g. an exception save)
  bool fall_back = false;   // a damaged checkpoint to resume from: try older ones
  std::string format = "native";
  bool integrated = false, per_rank = false;
  int keep_max = 0;           // 0: keep every checkpoint
  double save_seconds = 0;    // with --save-every 0: save every T seconds
  std::string save_best;      // keep the best checkpoints by this metric ("loss")
  std::string rule = "auto";  // less | greater | auto
  int keep_best = 1;
  bool exception_save = false;     // an exception escaping the loop saves "<name>_exception"
  double exception_timeout = 60;   // seconds the failing rank waits for the others
  double peer_timeout = -1;        // distckpt's peer timeout (< 0: its default)
  int64_t log_every = 10;          // print the loss every N steps
  int64_t throw_at_step = -1;      // simulated exception at the start of this step ...
  int throw_rank = -1;             // ... on this rank (-1: every rank, like a NaN check)
  bool publish = false;            // publish the final and best checkpoints at the end
  bool async_save = false;         // periodic saves in the background (the loop only stages)
  bool allow_unchecked = false;    // resume from a checkpoint whose data records no checksums
  int async_staging_mb = 256;      // staging memory per rank for --async
  std::vector<std::string> publish_only;
  std::string enc_key_file, enc_key_env, enc_mode = "AES-GCM";  // encrypt checkpoints with this key
  std::shared_ptr<const distckpt::EncryptionKey> key;
  double lr = 0.05;
  int batch = 16, hidden = 64, in = 32, out = 16;
  int layers = 2;               // an even number: Megatron pairs (column- then row-parallel)
  double freeze_fraction = 0;   // freeze whole layers, from the input, holding this much of the bytes
  bool incremental = false;     // incremental saves: unchanged (frozen) tensors are referenced
  // The node-local tier: local saves every N steps, every Mth drained to --dir.
  std::string local_dir, redundancy = "auto";
  int64_t local_every = 0;
  int global_every = 1, keep_local = 2;
  // The seeds' options (docs/seeds.md):
  int64_t epochs = 0, steps_per_epoch = 0;  // --epochs E --steps-per-epoch N: E*N steps
  bool by_epoch = false;                    // --save-every counts epochs (MMEngine's by_epoch)
  std::string prefix = "step";              // with --steps-per-epoch: MindSpore's {prefix}-{epoch}_{step_in_epoch}
  std::string filename_tmpl;                // MMEngine's filename_tmpl ("iter_{}")
  double keep_per_minutes = 0;              // MindSpore's keep_checkpoint_per_n_minutes
  int64_t eval_every = 0;                   // report the loss as a metric only every N steps
  int64_t resume_epoch = -1;                // resume from the end of this epoch
  int64_t save_begin = 0, save_every_epochs = 0;  // MMEngine's save_begin; Caffe2's every N epochs
  std::string out_dir;                      // MMEngine's out_dir
  bool no_remove_redundancy = false, no_crc_footer = false, save_at_start = false, no_save_last = false;
  std::vector<std::string> append_info;     // MindSpore's append_info, as key=value
  std::vector<std::string> greater_keys, less_keys;  // MMEngine's rule keys
};

constexpr float kMomentum = 0.9f;

// ---- hashing: the source of all "randomness" (pure functions, no RNG state) ----

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in [-1, 1) from the top 53 bits of a hash.
double unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-52 - 1.0; }

// Hash of one element of a named tensor, used for both init and the fingerprint.
uint64_t element_hash(uint64_t name_hash, int64_t global_index, uint64_t salt) {
  return splitmix64(name_hash ^
                    splitmix64(static_cast<uint64_t>(global_index) * 0x9E3779B97F4A7C15ULL + salt));
}

// Calls f(local_index, global_row_major_index) for every element of `box`.
template <typename F>
void for_each_element(const distckpt::Box& box, const distckpt::Shape& global_shape, F&& f) {
  const size_t nd = global_shape.size();
  std::vector<int64_t> idx(nd, 0);
  const int64_t n = box.num_elements();
  for (int64_t local = 0; local < n; ++local) {
    int64_t global = 0;
    for (size_t d = 0; d < nd; ++d) global = global * global_shape[d] + box.offset[d] + idx[d];
    f(local, global);
    for (size_t d = nd; d-- > 0;) {  // row-major odometer
      if (++idx[d] < box.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// ---- topology ----

struct Topology {
  int rank = 0, world = 1, dp_index = 0, tp_index = 0;
  MPI_Comm tp_comm = MPI_COMM_NULL;  // the TP ranks of my DP replica
  MPI_Comm dp_comm = MPI_COMM_NULL;  // my TP position in every DP replica
};

Topology make_topology(const Config& cfg, int rank, int world) {
  Topology t;
  t.rank = rank;
  t.world = world;
  t.dp_index = rank / cfg.tp;
  t.tp_index = rank % cfg.tp;
  MPI_Comm_split(MPI_COMM_WORLD, t.dp_index, t.tp_index, &t.tp_comm);
  MPI_Comm_split(MPI_COMM_WORLD, t.tp_index, t.dp_index, &t.dp_comm);
  return t;
}

// Local, "cannot happen" errors (a bad layout or state dict is a bug, identical on all
// ranks): print and take the whole job down.
void fatal_if_error(const distckpt::Status& s, const std::string& what, int rank) {
  if (s.ok()) return;
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(), s.to_string().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// ---- model ----

// Layers come in Megatron pairs: a column-parallel layer (rows split over TP, bias
// split alike) then a row-parallel one (columns split, bias replicated). With --layers
// 2 (the default) that is fc1 and fc2 above; deeper models repeat the pair with a ReLU
// between pairs, every width `hidden` but the input's and the output's.
// Parameter p of pair q is param[4q + p]: column weight, column bias, row weight, row bias.
enum Param { kW1, kB1, kW2, kB2, kPerPair };

struct Tensor {
  std::string name;
  distckpt::TensorLayout layout;
  distckpt::Box box;        // this rank's slice of the global tensor
  std::vector<float> data;  // row-major elements of `box`
};

struct Model {
  int in = 0, hl = 0, out = 0, hidden = 0;  // hl = hidden units held by this rank
  int pairs = 1;
  std::vector<Tensor> param, momentum;
  // Frozen (--freeze-fraction): never updated, so its parameters and momentum stay as
  // they were (whole layers, from the input side): an incremental save references them.
  std::vector<bool> frozen;
  int d_in(int q) const { return q == 0 ? in : hidden; }
  int d_out(int q) const { return q == pairs - 1 ? out : hidden; }
};

// Builds the layout for dev_mat {dp, tp} (tensor_map entry 0 = the tp axis) and checks
// that distckpt assigns this rank the slice the model code assumes.
Tensor make_tensor(const std::string& name, const distckpt::Shape& shape, const distckpt::Shape& map,
                   const distckpt::Box& expected, const Config& cfg, int rank) {
  auto layout = distckpt::TensorLayout::from_device_matrix(shape, {cfg.dp, cfg.tp}, map);
  fatal_if_error(layout.status(), "layout of " + name, rank);
  Tensor t{name, layout.value(), layout->slice_box(rank), {}};
  if (!(t.box == expected))
    fatal_if_error(distckpt::internal_error("slice " + t.box.to_string() + " != expected " +
                                            expected.to_string()), "layout of " + name, rank);
  t.data.assign(static_cast<size_t>(t.box.num_elements()), 0.0f);
  return t;
}

// Same global values whatever the layout: uniform in [-a, a], a = 1/sqrt(fan_in).
void init_uniform(Tensor& t, int fan_in) {
  const double a = 1.0 / std::sqrt(static_cast<double>(fan_in));
  const uint64_t nh = fnv1a64(t.name);
  for_each_element(t.box, t.layout.global_shape(), [&](int64_t local, int64_t global) {
    t.data[local] = static_cast<float>(a * unit(element_hash(nh, global, 0)));
  });
}

// Global bytes of a parameter (its momentum holds as many).
uint64_t global_bytes(const Tensor& t) {
  uint64_t n = 1;
  for (int64_t d : t.layout.global_shape()) n *= static_cast<uint64_t>(d);
  return n * sizeof(float);
}

// Freezes whole layers from the input side until they hold at least `fraction` of the
// parameter bytes (and so of parameters + momentum). At least one layer stays trainable.
void freeze_layers(Model& m, double fraction, int rank) {
  m.frozen.assign(m.param.size(), false);
  if (fraction <= 0) return;
  uint64_t total = 0;
  for (const Tensor& t : m.param) total += global_bytes(t);
  uint64_t frozen = 0;
  for (std::size_t layer = 0; 2 * layer < m.param.size(); ++layer) {
    if (static_cast<double>(frozen) >= fraction * static_cast<double>(total)) break;
    if (2 * layer + 2 >= m.param.size()) {
      if (rank == 0)
        std::fprintf(stderr, "error: --freeze-fraction %.4f would freeze every layer (use more --layers)\n", fraction);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (std::size_t p = 2 * layer; p < 2 * layer + 2; ++p) {
      m.frozen[p] = true;
      frozen += global_bytes(m.param[p]);
    }
  }
}

Model make_model(const Config& cfg, const Topology& topo) {
  Model m;
  m.in = cfg.in;
  m.hl = cfg.hidden / cfg.tp;
  m.out = cfg.out;
  m.hidden = cfg.hidden;
  m.pairs = cfg.layers / 2;
  const int64_t lo = static_cast<int64_t>(topo.tp_index) * m.hl;  // first hidden unit I hold
  struct Spec { std::string name; distckpt::Shape shape, map; distckpt::Box box; int fan_in; };
  for (int q = 0; q < m.pairs; ++q) {
    const int di = m.d_in(q), dout = m.d_out(q);
    const std::string col = "mlp.fc" + std::to_string(2 * q + 1), row = "mlp.fc" + std::to_string(2 * q + 2);
    const std::array<Spec, kPerPair> specs = {{
        {col + ".weight", {cfg.hidden, di}, {0, -1}, {{lo, 0}, {m.hl, di}}, di},
        {col + ".bias", {cfg.hidden}, {0}, {{lo}, {m.hl}}, di},
        {row + ".weight", {dout, cfg.hidden}, {-1, 0}, {{0, lo}, {dout, m.hl}}, cfg.hidden},
        {row + ".bias", {dout}, {-1}, {{0}, {dout}}, cfg.hidden},
    }};
    for (const Spec& s : specs) {
      m.param.push_back(make_tensor(s.name, s.shape, s.map, s.box, cfg, topo.rank));
      init_uniform(m.param.back(), s.fan_in);
      // Momentum buffers share the parameter's layout and start at zero.
      m.momentum.push_back(make_tensor("optim.momentum." + s.name, s.shape, s.map, s.box, cfg, topo.rank));
    }
  }
  freeze_layers(m, cfg.freeze_fraction, topo.rank);
  return m;
}

// ---- data: a pure function of (step, DP rank, sample, feature) ----

struct Batch {
  int n = 0;
  std::vector<float> x;  // [n, in], values in [-1, 1]
  std::vector<float> t;  // [n, out], teacher outputs
};

Batch make_batch(const Config& cfg, int64_t step, int dp_index) {
  Batch b;
  b.n = cfg.batch;
  b.x.resize(static_cast<size_t>(b.n) * cfg.in);
  b.t.resize(static_cast<size_t>(b.n) * cfg.out);
  const uint64_t data_seed = splitmix64(fnv1a64("data") ^ splitmix64(static_cast<uint64_t>(step)));
  const uint64_t teacher = fnv1a64("teacher");
  // Teacher weights with scale 3/sqrt(in) so the pre-sine sum has unit variance.
  const double scale = 3.0 / std::sqrt(static_cast<double>(cfg.in));
  for (int j = 0; j < b.n; ++j) {
    const uint64_t sample_seed = splitmix64(splitmix64(data_seed ^ static_cast<uint64_t>(dp_index)) ^
                                            static_cast<uint64_t>(j));
    float* x = &b.x[static_cast<size_t>(j) * cfg.in];
    for (int f = 0; f < cfg.in; ++f) x[f] = static_cast<float>(unit(splitmix64(sample_seed ^ f)));
    for (int o = 0; o < cfg.out; ++o) {
      double z = 0;
      for (int f = 0; f < cfg.in; ++f)
        z += scale * unit(element_hash(teacher, static_cast<int64_t>(o) * cfg.in + f, 0)) * x[f];
      b.t[static_cast<size_t>(j) * cfg.out + o] = static_cast<float>(std::sin(z));
    }
  }
  return b;
}

// ---- one training step; returns the global mean squared error before the update ----

double train_step(const Config& cfg, const Topology& topo, Model& m, int64_t step) {
  const Batch b = make_batch(cfg, step, topo.dp_index);
  const int n = b.n, hl = m.hl, out = m.out, P = m.pairs;
  // Per pair q: its input x[q] [n, d_in], the column layer's pre-activation and ReLU
  // (this rank's hidden units), and the pair's output z[q] (after the TP sum and bias).
  std::vector<std::vector<float>> x(P), pre(P), h(P), z(P);
  x[0] = b.x;
  for (int q = 0; q < P; ++q) {
    const int in = m.d_in(q), dout = m.d_out(q);
    const std::vector<float>& W1 = m.param[kPerPair * q + kW1].data;
    const std::vector<float>& b1 = m.param[kPerPair * q + kB1].data;
    const std::vector<float>& W2 = m.param[kPerPair * q + kW2].data;
    const std::vector<float>& xq = x[q];
    // The column layer: each TP rank computes its own hidden units completely.
    pre[q].resize(static_cast<size_t>(n) * hl);
    h[q].resize(pre[q].size());
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < hl; ++k) {
        float s = b1[k];
        for (int f = 0; f < in; ++f) s += W1[k * in + f] * xq[j * in + f];
        pre[q][j * hl + k] = s;
        h[q][j * hl + k] = std::max(s, 0.0f);
      }
    // The row layer: each TP rank contributes a partial sum over its hidden units; the
    // TP all-reduce completes it. Its bias is added once, after the reduction.
    std::vector<float>& y = z[q];
    y.assign(static_cast<size_t>(n) * dout, 0.0f);
    for (int j = 0; j < n; ++j)
      for (int o = 0; o < dout; ++o) {
        float s = 0;
        for (int k = 0; k < hl; ++k) s += W2[o * hl + k] * h[q][j * hl + k];
        y[j * dout + o] = s;
      }
    MPI_Allreduce(MPI_IN_PLACE, y.data(), n * dout, MPI_FLOAT, MPI_SUM, topo.tp_comm);
    if (q + 1 < P) {
      const std::vector<float>& b2 = m.param[kPerPair * q + kB2].data;
      for (int j = 0; j < n; ++j)
        for (int o = 0; o < dout; ++o) y[j * dout + o] += b2[o];
      x[q + 1].resize(y.size());
      for (size_t i = 0; i < y.size(); ++i) x[q + 1][i] = std::max(y[i], 0.0f);
    }
  }

  // Loss over the global batch; dy is normalised by it so the DP sum is the mean gradient.
  const std::vector<float>& b2_last = m.param[kPerPair * (P - 1) + kB2].data;
  const double global_count = static_cast<double>(n) * cfg.dp * out;
  double sq = 0;
  std::vector<float> dy(z[P - 1].size());
  for (int j = 0; j < n; ++j)
    for (int o = 0; o < out; ++o) {
      const float e = z[P - 1][j * out + o] + b2_last[o] - b.t[j * out + o];
      sq += static_cast<double>(e) * e;
      dy[j * out + o] = static_cast<float>(2.0 * e / global_count);
    }

  std::vector<std::vector<float>> g(m.param.size());
  for (size_t p = 0; p < m.param.size(); ++p) g[p].assign(m.param[p].data.size(), 0.0f);
  std::vector<float> dh(hl);
  for (int q = P - 1; q >= 0; --q) {
    const int in = m.d_in(q), dout = m.d_out(q);
    const std::vector<float>& W1 = m.param[kPerPair * q + kW1].data;
    const std::vector<float>& W2 = m.param[kPerPair * q + kW2].data;
    std::vector<float>& gW1 = g[kPerPair * q + kW1];
    std::vector<float>& gB1 = g[kPerPair * q + kB1];
    std::vector<float>& gW2 = g[kPerPair * q + kW2];
    std::vector<float>& gB2 = g[kPerPair * q + kB2];
    // The gradient with respect to this pair's input (partial over TP), for the pair below.
    std::vector<float> dx(q > 0 ? static_cast<size_t>(n) * in : 0, 0.0f);
    for (int j = 0; j < n; ++j) {
      for (int o = 0; o < dout; ++o) {
        const float d = dy[j * dout + o];
        gB2[o] += d;
        for (int k = 0; k < hl; ++k) gW2[o * hl + k] += d * h[q][j * hl + k];
      }
      // Backprop into this rank's hidden units only: W2's columns here are exactly those.
      for (int k = 0; k < hl; ++k) {
        float s = 0;
        for (int o = 0; o < dout; ++o) s += W2[o * hl + k] * dy[j * dout + o];
        dh[k] = pre[q][j * hl + k] > 0 ? s : 0.0f;
        gB1[k] += dh[k];
        for (int f = 0; f < in; ++f) gW1[k * in + f] += dh[k] * x[q][j * in + f];
        if (q > 0)
          for (int f = 0; f < in; ++f) dx[j * in + f] += W1[k * in + f] * dh[k];
      }
    }
    if (q == 0) break;
    // Through the TP sum and the ReLU between the pairs.
    MPI_Allreduce(MPI_IN_PLACE, dx.data(), static_cast<int>(dx.size()), MPI_FLOAT, MPI_SUM, topo.tp_comm);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = x[q][i] > 0 ? dx[i] : 0.0f;
    dy = std::move(dx);
  }

  // Data parallelism: sum the (already normalised) gradients over the DP replicas.
  for (size_t p = 0; p < g.size(); ++p)
    if (!m.frozen[p])
      MPI_Allreduce(MPI_IN_PLACE, g[p].data(), static_cast<int>(g[p].size()), MPI_FLOAT, MPI_SUM, topo.dp_comm);

  // SGD with momentum: v = 0.9 v + g; w -= lr v. Frozen layers keep both.
  const float lr = static_cast<float>(cfg.lr);
  for (size_t p = 0; p < m.param.size(); ++p) {
    if (m.frozen[p]) continue;
    std::vector<float>& w = m.param[p].data;
    std::vector<float>& v = m.momentum[p].data;
    for (size_t i = 0; i < w.size(); ++i) {
      v[i] = kMomentum * v[i] + g[p][i];
      w[i] -= lr * v[i];
    }
  }

  // Every TP rank of a replica holds the same y, so summing over dp_comm counts each
  // sample exactly once.
  MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, topo.dp_comm);
  return sq / global_count;
}

// ---- fingerprint: layout-independent hash of every parameter and momentum value ----

uint64_t fingerprint(const Model& m, int rank) {
  uint64_t sum = 0;
  for (const auto* group : {&m.param, &m.momentum})
    for (const Tensor& t : *group) {
      // Count each replicated slice once: only its lowest rank contributes.
      if (t.layout.replica_group(rank).front() != rank) continue;
      const uint64_t nh = fnv1a64(t.name);
      for_each_element(t.box, t.layout.global_shape(), [&](int64_t local, int64_t global) {
        sum += element_hash(nh, global, std::bit_cast<uint32_t>(t.data[local]));
      });
    }
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return sum;  // wrapping sum: independent of the order ranks and elements are visited
}

void print_fingerprint(const char* what, int64_t step, uint64_t fp, int rank) {
  if (rank != 0) return;
  std::printf("%s step %" PRId64 " fingerprint %016" PRIx64 "\n", what, step, fp);
  std::fflush(stdout);  // a crash later must not lose it
}

// ---- checkpointing ----

distckpt::StateDict make_state_dict(Model& m, int rank) {
  distckpt::StateDict sd(rank);
  for (auto* group : {&m.param, &m.momentum})
    for (Tensor& t : *group)
      fatal_if_error(sd.add_tensor(t.name, distckpt::DType::kFloat32, t.data.data(), t.layout),
                     "add_tensor", rank);
  return sd;
}

// Collective. False (after rank 0 printed why) when the save failed on any rank.
// The checkpoint policy of this run, for distckpt's CheckpointManager.
distckpt::CheckpointConfig checkpoint_config(const Config& cfg) {
  distckpt::CheckpointConfig c;
  c.directory = cfg.dir;
  c.prefix = cfg.prefix;
  // MindSpore's names when the run has epochs; MMEngine's template when given one.
  if (!cfg.filename_tmpl.empty()) c.filename_tmpl = cfg.filename_tmpl;
  else if (cfg.steps_per_epoch > 0) c.name_template = "{prefix}-{epoch}_{step_in_epoch}";
  else c.name_template = "{prefix}-{step}";
  c.steps_per_epoch = cfg.steps_per_epoch;
  c.by_epoch = cfg.by_epoch;
  c.keep_per_n_minutes = cfg.keep_per_minutes;
  c.save_every_steps = cfg.save_every;
  c.save_every_seconds = cfg.save_seconds;
  c.keep_max = cfg.keep_max;
  // --save-best: MMEngine's best checkpoint (best_loss_<name>) and best-K retention.
  c.best_metric = cfg.save_best;
  if (!cfg.save_best.empty()) c.save_best = {cfg.save_best};
  c.rule = cfg.rule == "less" ? distckpt::CompareRule::kLess
           : cfg.rule == "greater" ? distckpt::CompareRule::kGreater
                                   : distckpt::CompareRule::kAuto;
  if (!cfg.save_best.empty()) c.save_best_rules = {c.rule};
  c.keep_best = cfg.keep_best;
  c.format = *distckpt::format_from_name(cfg.format);  // checked when parsed
  if (cfg.integrated) c.integrated = true;
  if (cfg.per_rank) c.integrated = false;  // MindSpore's integrated_save=False
  c.exception_save = cfg.exception_save;
  c.exception_save_timeout_s = cfg.exception_timeout;
  c.publish_at_end = cfg.publish;
  c.publish_only = cfg.publish_only;
  c.async_save = cfg.async_save;
  c.incremental = cfg.incremental;
  c.async.staging_bytes = static_cast<std::size_t>(cfg.async_staging_mb) << 20;
  if (cfg.allow_unchecked) c.load.allow_unchecked = true;
  c.save_begin = cfg.save_begin;
  c.save_every_epochs = cfg.save_every_epochs;
  c.out_dir = cfg.out_dir;
  c.remove_redundancy = !cfg.no_remove_redundancy;
  c.ckpt_crc_footer = !cfg.no_crc_footer;
  c.save_at_start = cfg.save_at_start;
  c.save_last = !cfg.no_save_last;
  c.greater_keys = cfg.greater_keys;
  c.less_keys = cfg.less_keys;
  for (const std::string& kv : cfg.append_info) {  // key=value: an int, a float, true/false, else text
    const std::string key = kv.substr(0, kv.find('=')), text = kv.substr(kv.find('=') + 1);
    char* end = nullptr;
    const long long i = std::strtoll(text.c_str(), &end, 10);
    if (!text.empty() && *end == '\0') { c.append_info[key] = int64_t{i}; continue; }
    const double d = std::strtod(text.c_str(), &end);
    if (!text.empty() && *end == '\0') c.append_info[key] = d;
    else if (text == "true" || text == "false") c.append_info[key] = text == "true";
    else c.append_info[key] = text;
  }
  if (cfg.key) c.encryption = {*distckpt::encryption_mode_from_name(cfg.enc_mode), cfg.key};
  if (!cfg.local_dir.empty()) {
    c.local = {cfg.local_dir, cfg.redundancy};
    c.local_every_steps = cfg.local_every;
    c.global_every = cfg.global_every;
    c.keep_local = cfg.keep_local;
    c.save_every_steps = 0;  // the local tier's policy decides (--save-every is refused)
  }
  return c;
}

// The epoch a step belongs to, 1-based (0 without epochs, and for step 0).
int64_t epoch_of(const Config& cfg, int64_t step) {
  return cfg.steps_per_epoch > 0 && step > 0 ? (step - 1) / cfg.steps_per_epoch + 1 : 0;
}

[[noreturn]] void simulate_crash(int rank, int64_t step) {
  std::fprintf(stderr, "rank %d: crashing at step %" PRId64 " (simulated failure)\n", rank, step);
  std::fflush(stderr);
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // a real abort, but without littering core files
  std::abort();
}

// ---- main ----

// Returns the process exit code. All ranks return the same code.
int run(int argc, char** argv, int rank, int world) {
  // SIGUSR1 / SIGTERM (Slurm's --signal, scancel, mpirun): finish the step, save, exit
  // 0. Installed first, so that a signal arriving during start-up is not fatal: the
  // first step_end sees it.
  fatal_if_error(distckpt::CheckpointManager::install_signal_handlers(), "signals", rank);
  Config cfg;
  CLI::App app{"Data- and tensor-parallel MLP training with distckpt checkpoints"};
  app.add_option("--dp", cfg.dp, "data-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--tp", cfg.tp, "tensor-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--steps", cfg.steps, "train until this step")->check(CLI::NonNegativeNumber);
  app.add_option("--save-every", cfg.save_every, "checkpoint every N steps (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dir", cfg.dir, "checkpoint root directory")->required();
  app.add_flag("--resume", cfg.resume, "resume from the newest committed checkpoint in --dir");
  app.add_option("--resume-from", cfg.resume_from,
                 "resume from this checkpoint of --dir (a name, e.g. step-24_exception), verified first");
  app.add_flag("--fall-back", cfg.fall_back,
               "with --resume: when the newest checkpoint is damaged, resume from the newest undamaged older one");
  app.add_option("--format", cfg.format, "checkpoint format: native, ckpt, safetensors or hdf5")
      ->check(CLI::IsMember({"native", "ckpt", "safetensors", "hdf5"}));
  auto* integrated = app.add_flag("--integrated", cfg.integrated, "native: full tensors gathered into one file");
  app.add_flag("--no-integrated", cfg.per_rank,
               "ckpt: one .ckpt per rank of its slices, NAME/rank_<r>/NAME.ckpt (MindSpore's integrated_save=False)")
      ->excludes(integrated);
  app.add_option("--keep-max", cfg.keep_max, "keep the newest N checkpoints (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--save-seconds", cfg.save_seconds, "with --save-every 0: save every T seconds");
  app.add_option("--save-best", cfg.save_best,
                 "keep a best_<metric>_* copy of the best checkpoint by this metric (loss), and --keep-best of them");
  app.add_option("--rule", cfg.rule, "is a larger or smaller metric better")
      ->check(CLI::IsMember({"less", "greater", "auto"}));
  app.add_option("--keep-best", cfg.keep_best, "with --save-best: how many to keep")->check(CLI::PositiveNumber);
  app.add_option("--crash-at-step", cfg.crash_at_step,
                 "the last rank aborts at the start of this step (simulated failure)");
  app.add_flag("--exception-save", cfg.exception_save,
               "an exception escaping the training loop saves <name>_exception first (all ranks at one step)");
  app.add_option("--exception-timeout", cfg.exception_timeout,
                 "seconds the failing rank waits for the others before giving up (default 60)")
      ->check(CLI::PositiveNumber);
  app.add_option("--throw-at-step", cfg.throw_at_step,
                 "throw an exception at the start of this step (simulated error, e.g. a NaN loss)");
  app.add_option("--throw-rank", cfg.throw_rank, "with --throw-at-step: the rank that throws (-1: every rank)");
  app.add_flag("--publish", cfg.publish,
               "at the end, publish the final (and, with --save-best, the best) checkpoint as a safetensors file "
               "named with its SHA-256");
  app.add_option("--publish-only", cfg.publish_only, "with --publish: tensor name prefixes to publish, e.g. mlp.")
      ->delimiter(',');
  app.add_flag("--async", cfg.async_save,
               "periodic saves run in the background: the loop is blocked only while its tensors are staged");
  app.add_option("--async-staging-mb", cfg.async_staging_mb, "with --async: staging memory per rank (MiB)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--allow-unchecked", cfg.allow_unchecked,
               "resume from a checkpoint whose data records no checksums (a .ckpt without its CRC-32 footer)");
  app.add_option("--enc-key-file", cfg.enc_key_file,
                 "encrypt checkpoints (and resume) with this key file: 16/24/32 raw bytes or 32/48/64 hex digits");
  app.add_option("--enc-key-env", cfg.enc_key_env, "the key in this environment variable (hex digits)");
  app.add_option("--enc-mode", cfg.enc_mode, "with a key: AES-GCM (default), AES-CBC or SM4-CBC")
      ->check(CLI::IsMember({"AES-GCM", "AES-CBC", "SM4-CBC"}, CLI::ignore_case));
  app.add_option("--peer-timeout", cfg.peer_timeout,
                 "seconds a rank waits for its peers in a checkpoint collective before ending the job "
                 "(default: DISTCKPT_PEER_TIMEOUT_S, else 600; 0: no limit)");
  app.add_option("--log-every", cfg.log_every, "print the loss every N steps (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--local-dir", cfg.local_dir,
                 "node-local checkpoint directory (e.g. /dev/shm/ckpt): local saves, drained to --dir");
  app.add_option("--local-every", cfg.local_every, "with --local-dir: a local save every N steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--global-every", cfg.global_every,
                 "with --local-dir: drain every Mth local save to --dir (0: only the final one)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-local", cfg.keep_local, "with --local-dir: local checkpoints kept per node")
      ->check(CLI::PositiveNumber);
  app.add_option("--redundancy", cfg.redundancy, "with --local-dir: auto, partner, xor:K, rs:K+M or none");
  app.add_option("--epochs", cfg.epochs, "train this many epochs of --steps-per-epoch steps (instead of --steps)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps-per-epoch", cfg.steps_per_epoch,
                 "steps per epoch; names become MindSpore's PREFIX-EPOCH_STEPINEPOCH")
      ->check(CLI::PositiveNumber);
  app.add_flag("--by-epoch", cfg.by_epoch, "with --epochs: --save-every counts epochs (saves at epoch ends)");
  app.add_option("--prefix", cfg.prefix, "checkpoint name prefix (default step)");
  app.add_option("--filename-tmpl", cfg.filename_tmpl,
                 "MMEngine's filename_tmpl: one {} filled with the completed steps (epochs with --by-epoch)");
  app.add_option("--keep-per-minutes", cfg.keep_per_minutes,
                 "with --keep-max 0: keep one checkpoint per N minutes (MindSpore's keep_checkpoint_per_n_minutes)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", cfg.eval_every,
                 "report the loss as a metric (for --save-best) only every N steps (0: every step)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume-epoch", cfg.resume_epoch, "resume from the checkpoint saved at the end of this epoch")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-begin", cfg.save_begin, "periodic saves start at this step (epoch with --by-epoch)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-every-epochs", cfg.save_every_epochs, "also save at the end of every N epochs (Caffe2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--out-dir", cfg.out_dir, "checkpoints go to OUT_DIR/basename(--dir) (MMEngine's out_dir)");
  app.add_flag("--no-remove-redundancy", cfg.no_remove_redundancy, "every rank writes its replicas too");
  app.add_flag("--no-crc-footer", cfg.no_crc_footer, ".ckpt files without MindSpore's CRC-32 footer");
  app.add_flag("--save-at-start", cfg.save_at_start, "with nothing to resume from, save the initial state (Caffe2)");
  app.add_flag("--no-save-last", cfg.no_save_last, "do not save the final state at the end");
  app.add_option("--append-info", cfg.append_info, "info values saved with every checkpoint, as key=value")
      ->check([](const std::string& kv) { return kv.find('=') > 0 && kv.find('=') != std::string::npos ? "" : "key=value"; });
  app.add_option("--greater-keys", cfg.greater_keys, "metric names whose larger values are better (MMEngine)");
  app.add_option("--less-keys", cfg.less_keys, "metric names whose smaller values are better (MMEngine)");
  app.add_option("--lr", cfg.lr, "learning rate");
  app.add_option("--batch", cfg.batch, "samples per DP rank per step")->check(CLI::PositiveNumber);
  app.add_option("--hidden", cfg.hidden, "hidden units")->check(CLI::PositiveNumber);
  app.add_option("--layers", cfg.layers, "layers, an even number (pairs of column- and row-parallel layers; default 2)")
      ->check(CLI::PositiveNumber);
  app.add_option("--freeze-fraction", cfg.freeze_fraction,
                 "freeze whole layers from the input side holding at least this fraction of the bytes (a fine-tune)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--incremental", cfg.incremental,
               "incremental saves: tensors unchanged since the previous save are referenced, not written again");
  app.add_option("--in", cfg.in, "input features")->check(CLI::PositiveNumber);
  app.add_option("--out", cfg.out, "outputs")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = rank == 0 ? app.exit(e) : e.get_exit_code();  // only rank 0 prints
    return code == 0 ? 0 : 2;                                        // --help: 0; bad usage: 2
  }
  if (cfg.epochs > 0 && app.count("--steps") > 0) {
    if (rank == 0) std::fprintf(stderr, "error: give --steps or --epochs, not both\n");
    return 2;
  }
  if ((cfg.epochs > 0) != (cfg.steps_per_epoch > 0) || (cfg.by_epoch && cfg.epochs == 0)) {
    if (rank == 0) std::fprintf(stderr, "error: --epochs and --steps-per-epoch go together (and --by-epoch needs them)\n");
    return 2;
  }
  if (cfg.epochs > 0) cfg.steps = cfg.epochs * cfg.steps_per_epoch;
  if (!cfg.local_dir.empty() && app.count("--save-every") > 0) {
    if (rank == 0)
      std::fprintf(stderr, "error: with --local-dir, saves follow --local-every and --global-every; --save-every is refused\n");
    return 2;
  }
  if (cfg.local_dir.empty() && (app.count("--local-every") + app.count("--global-every") + app.count("--keep-local") +
                                app.count("--redundancy")) > 0) {
    if (rank == 0) std::fprintf(stderr, "error: --local-every, --global-every, --keep-local and --redundancy need --local-dir\n");
    return 2;
  }
  if (!cfg.enc_key_file.empty() && !cfg.enc_key_env.empty()) {
    if (rank == 0) std::fprintf(stderr, "error: give --enc-key-file or --enc-key-env, not both\n");
    return 2;
  }
  if (!cfg.enc_key_file.empty() || !cfg.enc_key_env.empty()) {
    auto key = !cfg.enc_key_file.empty() ? distckpt::EncryptionKey::from_file(cfg.enc_key_file)
                                         : distckpt::EncryptionKey::from_env(cfg.enc_key_env);
    if (!key.ok()) {
      if (rank == 0) std::fprintf(stderr, "error: %s\n", key.status().to_string().c_str());
      return 2;
    }
    cfg.key = std::make_shared<const distckpt::EncryptionKey>(std::move(key).value());
  }
  const int64_t ranks = static_cast<int64_t>(cfg.dp) * cfg.tp;
  if (world != ranks) {
    if (rank == 0)
      std::fprintf(stderr, "error: world size %d != dp*tp = %d*%d = %lld (run with mpirun -np %lld)\n", world,
                   cfg.dp, cfg.tp, static_cast<long long>(ranks), static_cast<long long>(ranks));
    return 2;
  }
  if (cfg.layers % 2 != 0) {
    if (rank == 0) std::fprintf(stderr, "error: --layers %d is odd (layers come in column/row-parallel pairs)\n", cfg.layers);
    return 2;
  }
  if (cfg.hidden % cfg.tp != 0) {
    if (rank == 0)
      std::fprintf(stderr, "error: --hidden %d is not divisible by --tp %d\n", cfg.hidden, cfg.tp);
    return 2;
  }

  Topology topo = make_topology(cfg, rank, world);
  Model model = make_model(cfg, topo);
  if (cfg.freeze_fraction > 0 && rank == 0) {
    uint64_t total = 0, trainable = 0;
    std::size_t frozen_layers = 0;
    for (std::size_t p = 0; p < model.param.size(); ++p) {
      total += 2 * global_bytes(model.param[p]);  // the parameter and its momentum
      if (!model.frozen[p]) trainable += 2 * global_bytes(model.param[p]);
      else if (p % 2 == 0) ++frozen_layers;
    }
    std::printf("frozen: %zu of %d layers, %.4f of the state's %llu bytes; each step changes %llu bytes\n",
                frozen_layers, cfg.layers, 1.0 - static_cast<double>(trainable) / static_cast<double>(total),
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(trainable));
  }
  distckpt::StateDict state = make_state_dict(model, rank);
  // The peer timeout bounds each wait in distckpt's collectives: a rank whose peer's
  // host died ends the job instead of waiting forever (docs/guide/tiers.md "Several nodes").
  auto comm = distckpt::make_mpi_comm(MPI_COMM_WORLD, {.peer_timeout_s = cfg.peer_timeout});  // freed before MPI_Finalize

  int exit_code = 0;
  int64_t step = 0;
  // Everything about checkpoints: when to save, what to keep, resume, signals.
  auto manager = distckpt::CheckpointManager::create(*comm, state, checkpoint_config(cfg));
  if (!manager.ok()) {
    if (rank == 0) std::fprintf(stderr, "checkpoint manager: %s\n", manager.status().to_string().c_str());
    exit_code = 2;
  }
  if (exit_code == 0 && (cfg.resume || !cfg.resume_from.empty() || cfg.resume_epoch >= 0)) {
    distckpt::ResumeOptions which;
    which.target = cfg.resume_from;
    which.epoch = cfg.resume_epoch;
    which.fall_back_to_previous = cfg.fall_back;
    auto resumed = (*manager)->resume(which);
    if (!resumed.ok()) {
      if (rank == 0) std::fprintf(stderr, "resume failed: %s\n", resumed.status().to_string().c_str());
      exit_code = 1;
    } else if (!resumed->resumed) {
      if (rank == 0) std::printf("no committed checkpoint in %s: starting from step 0\n", cfg.dir.c_str());
    } else {
      step = resumed->step;
      if (rank == 0) std::printf("resumed from %s\n", resumed->path.c_str());
      if (rank == 0 && cfg.local_dir.empty())
        for (const auto& damaged : resumed->skipped) std::printf("passed over %s (damaged)\n", damaged.c_str());
      if (rank == 0 && !cfg.local_dir.empty()) {
        const auto& src = resumed->sources;
        std::printf("restore sources: local=%llu peer=%llu parity=%llu global=%llu (parity_read=%llu lost_chunks=%llu)\n",
                    static_cast<unsigned long long>(src.local), static_cast<unsigned long long>(src.peer),
                    static_cast<unsigned long long>(src.parity), static_cast<unsigned long long>(src.global),
                    static_cast<unsigned long long>(src.parity_read), static_cast<unsigned long long>(src.lost_chunks));
        for (const auto& why : resumed->skipped) std::printf("passed over %s\n", why.c_str());
      }
      print_fingerprint("restored", step, fingerprint(model, rank), rank);
    }
  }
  double loss = 0;
  bool stopped = false;
  // The training loop, run by the manager so that an exception escaping it (with
  // --exception-save) is turned into a checkpoint on every rank before it is rethrown.
  auto loop = [&] {
    while (exit_code == 0 && step < cfg.steps) {
      ++step;
      if (step == cfg.crash_at_step && rank == world - 1) simulate_crash(rank, step);
      if (step == cfg.throw_at_step && (cfg.throw_rank < 0 || cfg.throw_rank == rank)) {
        --step;  // this step never ran: the state is that of the previous one
        throw std::runtime_error("simulated error at the start of step " + std::to_string(step + 1));
      }
      loss = train_step(cfg, topo, model, step);
      if (rank == 0 && step % cfg.log_every == 0) {
        std::printf("step %" PRId64 " loss %.6f\n", step, loss);
        std::fflush(stdout);
      }
      fatal_if_error(state.set_info("loss", distckpt::InfoValue{loss}), "set_info", rank);
      // With epochs: the current epoch, 1-based, which at its last step is the number
      // of completed epochs (what step_end counts with epoch_end).
      const int64_t epoch = epoch_of(cfg, step);
      const bool epoch_end = cfg.steps_per_epoch > 0 && step % cfg.steps_per_epoch == 0;
      std::map<std::string, double> metrics;
      if (cfg.eval_every == 0 || step % cfg.eval_every == 0) metrics["loss"] = loss;  // an "evaluation" step
      auto out = (*manager)->step_end(step, epoch, metrics, epoch_end);
      if (!out.ok()) {
        if (rank == 0) std::fprintf(stderr, "save failed: %s\n", out.status().to_string().c_str());
        exit_code = 1;
      } else {
        if (out->saved) print_fingerprint("saved", step, fingerprint(model, rank), rank);
        if (rank == 0 && cfg.async_save)
          for (const auto& done : out->committed) std::printf("committed %s (in the background)\n", done.c_str());
        if (rank == 0 && !out->background_error.ok())
          std::fprintf(stderr, "background save failed: %s\n", out->background_error.to_string().c_str());
        if (rank == 0)
          for (const auto& gone : out->removed) std::printf("removed %s (retention)\n", gone.c_str());
        if (rank == 0)
          for (const auto& best : out->best) std::printf("best %s\n", best.c_str());
        if (rank == 0)
          for (const auto& done : out->drained) std::printf("drained %s\n", done.c_str());
        if (rank == 0 && !out->drain_error.ok())
          std::fprintf(stderr, "drain failed: %s\n", out->drain_error.to_string().c_str());
        if (out->stop && out->exception_rank >= 0) {
          // Another rank threw: it is rethrowing; end without further collective calls.
          if (rank == 0)
            std::fprintf(stderr, "rank %d threw (%s): %s\n", out->exception_rank, out->exception.c_str(),
                         out->saved ? ("saved " + out->path).c_str() : out->save_error.to_string().c_str());
          exit_code = 3;
          return;
        }
        if (out->stop) {
          if (rank == 0)
            std::printf("signal received: saved %s at step %" PRId64 ", exiting\n", out->path.c_str(), step);
          stopped = true;
          return;
        }
      }
    }
  };
  if (exit_code == 0) {
    try {
      (*manager)->run(loop);
    } catch (const std::exception& e) {
      // run() saved what it could and printed it. If the other ranks never reached the
      // manager, they are blocked in a collective of the training step: end the job.
      if (!(*manager)->last_exception_save().ok()) {
        std::fprintf(stderr, "rank %d: aborting the job\n", rank);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
      exit_code = 3;
    }
  }
  if (exit_code == 0 && !stopped) {
    auto last = (*manager)->end(step, epoch_of(cfg, step), {{"loss", loss}},
                                cfg.steps_per_epoch > 0 && step % cfg.steps_per_epoch == 0);
    if (!last.ok()) {
      if (rank == 0) std::fprintf(stderr, "final save failed: %s\n", last.status().to_string().c_str());
      exit_code = 1;
    } else {
      if (last->saved) print_fingerprint("saved", step, fingerprint(model, rank), rank);
      if (rank == 0 && cfg.async_save)
        for (const auto& done : last->committed) std::printf("committed %s\n", done.c_str());
      if (rank == 0)
        for (const auto& p : last->published) std::printf("published %s\n", p.c_str());
      if (rank == 0)
        for (const auto& done : last->drained) std::printf("drained %s\n", done.c_str());
      if (rank == 0 && !last->drain_error.ok())
        std::fprintf(stderr, "drain failed: %s\n", last->drain_error.to_string().c_str());
    }
  }
  if (exit_code == 0) print_fingerprint("final", step, fingerprint(model, rank), rank);

  // The manager borrows the communicator: it goes first.
  if (manager.ok()) manager->reset();
  comm.reset();
  MPI_Comm_free(&topo.tp_comm);
  MPI_Comm_free(&topo.dp_comm);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // --async saves make MPI calls on a background thread while the loop makes its own.
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int code = run(argc, argv, rank, world);
  MPI_Finalize();
  return code;
}
