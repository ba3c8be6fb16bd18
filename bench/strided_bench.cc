// Strided saves and loads against packed ones of the same bytes, in one run.
//
//   mpirun -np N strided_bench --dir DIR [--blocks 64] [--edge 1024] [--halo 2] [--runs 5] [--json]
//
// Each rank holds `blocks` float32 blocks of edge x edge elements, each inside an array
// with `halo` cells on every side (a stencil code's ghost cells), and the same values in
// packed arrays. Runs alternate: a packed save, a strided save (the interiors, straight
// from the haloed arrays), then the two loads, each into its own memory; each checkpoint
// is removed before the next run. Reported: the median of each over the runs and the
// ratios strided / packed of their speeds (1.0: as fast). The strided save must store the
// same bytes: the run checks the strided load's values against the packed arrays.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "distckpt/checkpoint.h"
#include "distckpt/mpi_comm.h"
#include "quiet_mpi.h"

namespace {

using distckpt::DType;
using distckpt::StateDict;
using distckpt::Strides;
using distckpt::TensorLayout;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Blocks {
  std::vector<std::vector<float>> packed, haloed;
};

// Block b of this rank: element (i, j) = a value of (rank, b, i, j).
Blocks make_blocks(int rank, int blocks, int64_t edge, int64_t halo) {
  Blocks out;
  const int64_t pitch = edge + 2 * halo;
  for (int b = 0; b < blocks; ++b) {
    std::vector<float> packed(static_cast<std::size_t>(edge * edge));
    std::vector<float> haloed(static_cast<std::size_t>(pitch * pitch), -1.0f);
    for (int64_t i = 0; i < edge; ++i)
      for (int64_t j = 0; j < edge; ++j) {
        const float v = static_cast<float>((rank * 131 + b * 17 + i * 7 + j) % 100003);
        packed[static_cast<std::size_t>(i * edge + j)] = v;
        haloed[static_cast<std::size_t>((i + halo) * pitch + j + halo)] = v;
      }
    out.packed.push_back(std::move(packed));
    out.haloed.push_back(std::move(haloed));
  }
  return out;
}

// The state of either kind: tensor "block.<b>" of global shape [world * edge, edge], the
// rank's block its rows.
void fill(StateDict& state, std::vector<std::vector<float>>& arrays, bool strided, int world, int64_t edge,
          int64_t halo) {
  const int64_t pitch = edge + 2 * halo;
  auto layout = *TensorLayout::from_device_matrix({world * edge, edge}, {world}, {0, -1});
  for (std::size_t b = 0; b < arrays.size(); ++b) {
    const std::string name = "block." + std::to_string(b);
    const distckpt::Status st =
        strided ? state.add_tensor(name, DType::kFloat32, arrays[b].data() + halo * pitch + halo, Strides{pitch, 1}, layout)
                : state.add_tensor(name, DType::kFloat32, arrays[b].data(), layout);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

void check(const distckpt::Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s\n", st.to_string().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  CLI::App app{"strided saves and loads against packed ones"};
  std::string dir;
  int blocks = 64, runs = 5;
  int64_t edge = 1024, halo = 2;
  bool json = false;
  app.add_option("--dir", dir, "checkpoint root")->required();
  app.add_option("--blocks", blocks, "blocks per rank")->capture_default_str();
  app.add_option("--edge", edge, "elements per block side")->capture_default_str();
  app.add_option("--halo", halo, "halo cells on each side")->capture_default_str();
  app.add_option("--runs", runs, "alternating runs; medians reported")->capture_default_str();
  app.add_flag("--json", json, "one JSON line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    MPI_Finalize();
    return code;
  }
  auto comm = distckpt::make_mpi_comm(MPI_COMM_WORLD);
  const int rank = comm->rank(), world = comm->size();
  Blocks data = make_blocks(rank, blocks, edge, halo);
  Blocks target = make_blocks(rank, blocks, edge, halo);  // loads land here (each run: -2 first)
  StateDict packed(rank), strided(rank), packed_in(rank), strided_in(rank);
  fill(packed, data.packed, false, world, edge, halo);
  fill(strided, data.haloed, true, world, edge, halo);
  fill(packed_in, target.packed, false, world, edge, halo);
  fill(strided_in, target.haloed, true, world, edge, halo);

  std::vector<double> save_packed, save_strided, load_packed, load_strided;
  auto timed = [&](auto&& body) {
    distckpt::bench::timed_phase_barrier();
    const double t0 = now();
    body();
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
  };
  for (int run = 0; run < runs; ++run) {
    for (bool is_strided : {false, true}) {
      distckpt::SaveOptions o;
      o.name = is_strided ? "strided" : "packed";
      o.update_latest = false;
      (is_strided ? save_strided : save_packed)
          .push_back(timed([&] { check(distckpt::save(*comm, is_strided ? strided : packed, dir, o).status()); }));
    }
    // Loads must write every value: the targets hold none of them before.
    for (auto* arrays : {&target.packed, &target.haloed})
      for (auto& a : *arrays) std::fill(a.begin(), a.end(), -2.0f);
    for (bool is_strided : {false, true}) {
      const std::string path = dir + (is_strided ? "/strided" : "/packed");
      (is_strided ? load_strided : load_packed).push_back(timed([&] {
        check(distckpt::load(*comm, is_strided ? strided_in : packed_in, path, {}).status());
      }));
    }
    // The strided save's bytes, loaded into haloed arrays, are the packed values; so are the
    // packed load's; the halo cells kept their -2.
    const int64_t pitch = edge + 2 * halo;
    for (int b = 0; b < blocks; ++b) {
      bool same = target.packed[b] == data.packed[b];
      for (int64_t i = 0; i < pitch && same; ++i)
        for (int64_t j = 0; j < pitch && same; ++j) {
          const bool inside = i >= halo && i < halo + edge && j >= halo && j < halo + edge;
          const float want = inside ? data.packed[b][static_cast<std::size_t>((i - halo) * edge + j - halo)] : -2.0f;
          same = target.haloed[b][static_cast<std::size_t>(i * pitch + j)] == want;
        }
      if (!same) {
        std::fprintf(stderr, "rank %d: block %d differs after the round trips\n", rank, b);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    distckpt::bench::quiet_barrier();
    if (rank == 0) {
      std::filesystem::remove_all(dir + "/packed");
      std::filesystem::remove_all(dir + "/strided");
    }
    distckpt::bench::quiet_barrier();
  }
  const double bytes = static_cast<double>(blocks) * static_cast<double>(edge * edge) * 4 * world;
  const double sp = median(save_packed), ss = median(save_strided), lp = median(load_packed), ls = median(load_strided);
  if (rank == 0) {
    if (json) {
      nlohmann::json j = {{"ranks", world},           {"blocks", blocks},       {"edge", edge},
                          {"halo", halo},             {"runs", runs},           {"bytes", bytes},
                          {"save_packed_s", sp},      {"save_strided_s", ss},   {"load_packed_s", lp},
                          {"load_strided_s", ls},     {"save_ratio", sp / ss},  {"load_ratio", lp / ls},
                          {"save_packed_all", save_packed}, {"save_strided_all", save_strided}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%d ranks x %d blocks of %lld^2 float32 (halo %lld), %.0f MiB in all, median of %d\n", world, blocks,
                  static_cast<long long>(edge), static_cast<long long>(halo), bytes / (1 << 20), runs);
      std::printf("save: packed %.3f s, strided %.3f s: strided at %.2fx of packed\n", sp, ss, sp / ss);
      std::printf("load: packed %.3f s, strided %.3f s: strided at %.2fx of packed\n", lp, ls, lp / ls);
    }
  }
  comm.reset();
  MPI_Finalize();
  return 0;
}
