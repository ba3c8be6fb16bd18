#include "plan/simulate.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>

#include "layout/slices.h"
#include "plan/load_plan.h"
#include "plan/save_plan.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_plan {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Model {
  std::vector<std::string> names;
  std::vector<TensorLayout> layouts;
  std::vector<int> stage;                     // per tensor
  std::vector<std::vector<int>> by_stage;     // tensors of each stage
  int dp = 0, group = 0;
};

// Six tensors per layer, as in a Megatron-style transformer: column-parallel weights
// (split rows over TP), row-parallel weights (split columns), a split bias and a
// replicated norm. Layers are spread evenly over the pipeline stages; stage s holds the
// contiguous ranks [s * dp * tp, (s + 1) * dp * tp).
Result<Model> build_model(int ranks, int tensors, int64_t hidden, Parallelism p, const std::string& what) {
  Model m;
  constexpr int kMax = 1 << 24;
  if (ranks < 1 || p.tp < 1 || p.pp < 1 || p.dp < 0 || ranks > kMax || p.tp > kMax || p.pp > kMax || p.dp > kMax ||
      tensors > kMax)
    return invalid_argument(what + ": ranks, tp and pp must be in 1.." + std::to_string(kMax) +
                            " and tensors at most " + std::to_string(kMax));
  m.dp = p.dp > 0 ? p.dp : static_cast<int>(ranks / (int64_t{p.tp} * p.pp));
  if (static_cast<int64_t>(m.dp) * p.tp * p.pp != ranks)
    return invalid_argument(what + ": " + std::to_string(ranks) + " ranks are not dp x tp x pp (tp " +
                            std::to_string(p.tp) + ", pp " + std::to_string(p.pp) + ")");
  const int layers = (tensors + 5) / 6;
  if (tensors < 1 || layers < p.pp)
    return invalid_argument(what + ": " + std::to_string(tensors) + " tensors give fewer layers than " +
                            std::to_string(p.pp) + " pipeline stages");
  if (hidden < 1 || hidden % p.tp != 0)
    return invalid_argument(what + ": hidden size " + std::to_string(hidden) + " is not divisible by tp " +
                            std::to_string(p.tp));
  m.group = m.dp * p.tp;
  m.by_stage.assign(static_cast<std::size_t>(p.pp), {});
  const int64_t h = hidden;
  for (int i = 0; i < tensors; ++i) {
    const int layer = i / 6, kind = i % 6;
    const int stage = static_cast<int>(static_cast<int64_t>(layer) * p.pp / layers);
    std::vector<int> ranks_of_stage(static_cast<std::size_t>(m.group));
    std::iota(ranks_of_stage.begin(), ranks_of_stage.end(), stage * m.group);
    static const char* kinds[] = {"qkv.weight", "proj.weight", "fc1.weight", "fc1.bias", "fc2.weight", "norm.weight"};
    static const Shape maps[] = {{0, -1}, {-1, 0}, {0, -1}, {0}, {-1, 0}, {-1}};
    const Shape shapes[] = {{3 * h, h}, {h, h}, {4 * h, h}, {4 * h}, {h, 4 * h}, {h}};
    DISTCKPT_ASSIGN_OR_RETURN(TensorLayout layout,
                              TensorLayout::from_device_matrix(shapes[kind], {m.dp, p.tp}, maps[kind],
                                                               std::move(ranks_of_stage)));
    m.names.push_back("layers." + std::to_string(layer) + "." + kinds[kind]);
    m.layouts.push_back(std::move(layout));
    m.stage.push_back(stage);
    m.by_stage[static_cast<std::size_t>(stage)].push_back(i);
  }
  return m;
}

}  // namespace

Result<SimulationReport> simulate_planning(const SimulationConfig& config) {
  using Clock = std::chrono::steady_clock;
  SimulationReport report;
  const int load_ranks = config.load_ranks > 0 ? config.load_ranks : config.ranks;
  DISTCKPT_ASSIGN_OR_RETURN(Model saved, build_model(config.ranks, config.tensors, config.hidden, config.save, "save"));
  DISTCKPT_ASSIGN_OR_RETURN(Model loaded, build_model(load_ranks, config.tensors, config.hidden, config.load, "load"));
  report.save_dp = saved.dp;
  report.load_dp = loaded.dp;
  report.load_ranks = load_ranks;
  std::vector<PlannedTensor> planned;
  for (std::size_t i = 0; i < saved.names.size(); ++i) {
    planned.push_back(PlannedTensor{saved.names[i], DType::kBFloat16, &saved.layouts[i]});
    report.state_bytes += static_cast<uint64_t>(full_box(saved.layouts[i].global_shape()).num_elements()) * 2;
  }

  // Save: what every rank computes to agree, then rank 0's plan and index.
  auto start = Clock::now();
  const std::string description = describe_tensors(planned);
  DISTCKPT_ASSIGN_OR_RETURN(const std::vector<int64_t> print, fingerprint(description));
  report.describe_s = seconds_since(start);
  report.description_bytes = description.size();
  start = Clock::now();
  DISTCKPT_ASSIGN_OR_RETURN(SavePlan plan, plan_save(planned, config.ranks, /*remove_redundancy=*/true));
  report.plan_save_s = seconds_since(start);
  proto::Index& index = plan.index;
  index.set_name("simulated");
  index.set_step(1000);
  uint32_t crc = static_cast<uint32_t>(print[0]);
  for (auto& t : *index.mutable_tensors())
    for (auto& c : *t.mutable_chunks()) {
      crc = crc * 1664525u + 1013904223u;  // realistic (incompressible) checksums for the size
      c.set_crc32c(crc);
      ++report.chunks;
    }
  start = Clock::now();
  const std::string framed = internal_format::frame_index(index);
  report.frame_index_s = seconds_since(start);
  report.index_bytes = framed.size();
  report.files = static_cast<uint64_t>(index.files_size());
  uint64_t total = 0;
  for (uint64_t b : plan.bytes_per_rank) {
    total += b;
    report.writer_max_bytes = std::max(report.writer_max_bytes, b);
  }
  if (total != report.state_bytes)
    return internal_error("simulation: the plan writes " + std::to_string(total) + " bytes, the state has " +
                          std::to_string(report.state_bytes));
  uint64_t largest_slice = 0;
  for (const auto& t : index.tensors())
    for (const auto& c : t.chunks()) largest_slice = std::max<uint64_t>(largest_slice, c.length());
  const uint64_t bound = std::max<uint64_t>(largest_slice, (total + static_cast<uint64_t>(config.ranks) - 1) /
                                                               static_cast<uint64_t>(config.ranks));
  report.writer_balance = bound == 0 ? 0 : static_cast<double>(report.writer_max_bytes) / static_cast<double>(bound);

  // Load, per rank: parse and validate the index, look tensors up, index their chunks.
  start = Clock::now();
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index parsed, internal_format::parse_index(framed, "simulated/index.pb"));
  report.parse_index_s = seconds_since(start);
  start = Clock::now();
  std::map<std::string, int> stored;
  for (int i = 0; i < parsed.tensors_size(); ++i) stored[parsed.tensors(i).name()] = i;
  std::vector<ChunkLookup> lookups;
  lookups.reserve(loaded.names.size());
  std::vector<const proto::Tensor*> stored_tensors;
  for (const std::string& name : loaded.names) {
    stored_tensors.push_back(&parsed.tensors(stored.at(name)));
    lookups.emplace_back(*stored_tensors.back());
  }
  report.build_lookups_s = seconds_since(start);

  // Load, every simulated rank: the reads for its boxes and who reads replicated boxes.
  for (int r = 0; r < load_ranks; ++r) {
    const auto rank_start = Clock::now();
    ReplicaGroups groups(r);
    for (int t : loaded.by_stage[static_cast<std::size_t>(r / loaded.group)]) {
      const TensorLayout& layout = loaded.layouts[static_cast<std::size_t>(t)];
      const Box box = layout.slice_box(r);
      int64_t covered = 0;
      const std::vector<ReadItem> reads = lookups[static_cast<std::size_t>(t)].plan_reads(box, &covered);
      report.reads += reads.size();
      if (covered != box.num_elements())
        return internal_error("simulation: rank " + std::to_string(r) + ": tensor '" + loaded.names[t] +
                              "': the plan covers " + std::to_string(covered) + " of " + box.to_string());
      const uint64_t bytes = static_cast<uint64_t>(covered) * 2;
      report.bytes_needed += bytes;
      const int group = groups.group_of(layout);
      if (groups.members(group).size() > 1 && !reads.empty()) {
        const proto::Chunk& first = stored_tensors[static_cast<std::size_t>(t)]->chunks(reads.front().chunk);
        (void)groups.need(group, first.file_id(), first.byte_offset(), bytes);
      }
    }
    groups.assign();
    const double took = seconds_since(rank_start);
    report.plan_load_total_s += took;
    report.plan_load_max_s = std::max(report.plan_load_max_s, took);
  }
  for (const TensorLayout& layout : loaded.layouts) {  // every holder of a slice needs its bytes
    const internal_layout::DeviceSlices slices(layout);
    report.bytes_needed_expected +=
        static_cast<uint64_t>(full_box(layout.global_shape()).num_elements()) * 2 * static_cast<uint64_t>(slices.replicas());
  }
  if (report.bytes_needed != report.bytes_needed_expected)
    return internal_error("simulation: the load plans need " + std::to_string(report.bytes_needed) +
                          " bytes, expected " + std::to_string(report.bytes_needed_expected));
  return report;
}

}  // namespace distckpt::internal_plan
