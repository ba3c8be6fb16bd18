// One distckpt operation on a real file system, for tests/realfs/run.sh, which fills the
// disk, makes it read-only, takes write permission away or sets a quota around it.
// Every rank prints one line, "rank R: ok" or "rank R: <status>", so the script can check
// that every rank ends with the same clear error; exit 0 only when the operation worked.
//
//   realfs_ops save FORMAT MODE ROOT NAME MIB   FORMAT native|ckpt|safetensors|hdf5,
//                                               MODE sharded|integrated|async
//   realfs_ops manager ROOT STEP MIB [KEEP]     a CheckpointManager save (retention: KEEP)
//   realfs_ops fill-at OP:PATTERN FILLER ROOT NAME MIB
//                                               a save during which the disk really fills
//                                               (FILLER grows until ENOSPC) just before
//                                               the file system operation OP on a path
//                                               containing PATTERN (create:latest.tmp-:
//                                               the move of `latest`)
//   realfs_ops retain FILLER ROOT MIB           manager saves with keep_max 1 on a disk
//                                               filled before retention runs
//   realfs_ops load ROOT NAME MIB               load and check every value
//   realfs_ops local-full FILLER ROOT LOCAL MIB sync|async
//                                               local-tier saves on a full tmpfs: l1, removed
//                                               into spares that are then scribbled over;
//                                               the disk filled (FILLER) but for 1 MiB; l2
//                                               and l3 into the spares (through a new, then
//                                               a kept mapping) must work and restore; l4
//                                               into the spares fails on a disk full for its
//                                               record, and l5 of the same size then fits in
//                                               its room; a save of twice the size must fail
//                                               on every rank (reported), and l5 restore
//   realfs_ops convert SRC DST FORMAT           (one process)
//   realfs_ops publish SRC                      (one process)
#include <mpi.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "storage/fault_fs.h"

using namespace distckpt;

namespace {

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Writes zeros to `path` until the file system refuses (ENOSPC, EDQUOT): a real full disk.
void fill_disk(const std::string& path, bool say = true) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) return;
  std::vector<char> block(1 << 16, 0);
  while (std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
  }
  std::fclose(f);
  if (say) std::fprintf(stderr, "rank %d: filled the disk (%s)\n", rank_of(), path.c_str());
}

// A tensor split by rows over the world and a replicated one: about `mib` MiB in all.
struct Model {
  std::vector<float> w, b;
  StateDict state{0};
  Model(Comm& comm, int64_t mib) : state(comm.rank()) {
    const int64_t cols = 1024, world = comm.size();
    int64_t rows = std::max<int64_t>(world, mib * 256);  // 4 KiB a row
    rows -= rows % world;
    const int64_t mine = rows / world;
    w.resize(static_cast<std::size_t>(mine * cols));
    for (int64_t i = 0; i < mine * cols; ++i) w[static_cast<std::size_t>(i)] = value(comm.rank() * mine * cols + i);
    b.resize(static_cast<std::size_t>(cols));
    for (int64_t i = 0; i < cols; ++i) b[static_cast<std::size_t>(i)] = value(-1 - i);
    auto lw = TensorLayout::from_device_matrix({rows, cols}, {world}, {0, -1});
    auto lb = TensorLayout::from_device_matrix({cols}, {world}, {-1});
    if (!lw.ok() || !lb.ok() || !state.add_tensor("w", DType::kFloat32, w.data(), *lw).ok() ||
        !state.add_tensor("b", DType::kFloat32, b.data(), *lb).ok())
      MPI_Abort(MPI_COMM_WORLD, 3);
    rows_ = rows;
  }
  static float value(int64_t i) { return static_cast<float>(std::sin(static_cast<double>(i) * 0.001)); }
  bool check(Comm& comm) const {
    const int64_t cols = 1024, mine = rows_ / comm.size();
    for (int64_t i = 0; i < mine * cols; ++i)
      if (w[static_cast<std::size_t>(i)] != value(comm.rank() * mine * cols + i)) return false;
    for (int64_t i = 0; i < cols; ++i)
      if (b[static_cast<std::size_t>(i)] != value(-1 - i)) return false;
    return true;
  }
  void zero() {
    std::fill(w.begin(), w.end(), 0.0f);
    std::fill(b.begin(), b.end(), 0.0f);
  }
  int64_t rows_ = 0;
};

int report(const Status& st, const std::string& warning = "") {
  const std::string line = st.ok() ? "ok" + (warning.empty() ? std::string() : " (warning: " + warning + ")")
                                   : st.to_string();
  std::printf("rank %d: %s\n", rank_of(), line.c_str());
  std::fflush(stdout);
  return st.ok() ? 0 : 1;
}

Format parse_format(const std::string& f) { return format_from_name(f).value_or(Format::kNative); }

int run(int argc, char** argv) {
  const std::string op = argv[1];
  if (op == "convert" || op == "publish") {
    if (op == "convert" && argc == 5) return report(convert_checkpoint(argv[2], argv[3], parse_format(argv[4])).status());
    if (op == "publish" && argc == 3) return report(publish_checkpoint(argv[2]).status());
    return 2;
  }
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  if (op == "save" && argc == 7) {
    Model m(*comm, std::stoll(argv[6]));
    SaveOptions o;
    o.name = argv[5];
    o.format = parse_format(argv[2]);
    if (std::string(argv[3]) == "integrated") o.integrated = true;
    if (std::string(argv[3]) == "async") {
      auto ckpt = make_async_checkpointer(MPI_COMM_WORLD, {.staging_bytes = 4 << 20, .slab_bytes = 1 << 20});
      if (!ckpt.ok()) return report(ckpt.status());
      Status started = (*ckpt)->save_async(m.state, argv[4], o);
      if (!started.ok()) return report(started);
      return report((*ckpt)->wait().status());
    }
    auto saved = save(*comm, m.state, argv[4], o);
    return report(saved.status(), saved.ok() ? saved->warning : "");
  }
  if (op == "local-full" && argc == 7) {
    const std::string filler = argv[2], root = argv[3];
    const LocalTier tier{argv[4], "auto", true};
    const int64_t mib = std::stoll(argv[5]);
    const bool async = std::string(argv[6]) == "async";
    auto ckpt = make_async_checkpointer(MPI_COMM_WORLD, {.staging_bytes = 4 << 20, .slab_bytes = 1 << 20});
    if (!ckpt.ok()) return report(ckpt.status());
    auto save_as = [&](Model& m, const std::string& name, std::shared_ptr<FileSystem> fs = nullptr) -> Status {
      SaveOptions o;
      o.name = name;
      o.fs = fs;
      if (!async) return save_local(*comm, m.state, root, o, tier).status();
      DISTCKPT_RETURN_IF_ERROR((*ckpt)->save_local_async(m.state, root, o, tier));
      return (*ckpt)->wait_local().status();
    };
    auto restores = [&](int64_t size, const std::string& name) -> Status {
      Model m(*comm, size);
      m.zero();
      RestoreOptions ro;
      ro.name = name;
      ro.fall_back = false;
      auto r = restore(*comm, m.state, root, tier, ro);
      if (!r.ok()) return r.status();
      if (!m.check(*comm)) return corruption("restored '" + name + "' has wrong values");
      return Status();
    };
    // The spares' bytes made wrong, keeping their pages: what a save leaves in them must be
    // its own bytes.
    auto scribble = [&] {
      if (comm->rank() == 0) {
        const std::string spares = std::string(argv[4]) + "/.distckpt-spare";
        for (const auto& e : std::filesystem::directory_iterator(spares)) {
          std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
          const std::vector<char> junk(static_cast<std::size_t>(e.file_size()), '\x5a');
          f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
    };
    Model m(*comm, mib);
    for (const char* name : {"l1", "l2", "l3"}) {
      if (std::string(name) != "l1") scribble();
      if (Status st = save_as(m, name); !st.ok()) return report(st.with_context(std::string("save ") + name));
      if (Status st = restores(mib, name); !st.ok()) return report(st.with_context(std::string("restore ") + name));
      if (std::string(name) == "l3") break;
      if (Status st = remove_local(*comm, root, tier, name); !st.ok()) return report(st);
      if (std::string(name) == "l1") {
        // The disk full but for 1 MiB (the records, directories and ids): the spares are
        // the only room for data.
        if (comm->rank() == 0) {
          fill_disk(filler, false);
          std::filesystem::resize_file(filler, std::filesystem::file_size(filler) - (1 << 20));
        }
        MPI_Barrier(MPI_COMM_WORLD);  // (the same as full(true) below)
      }
    }
    // l4 writes its data into the spares (through the kept mappings), then the disk fills
    // for real just before its record is made, and it fails; its files must give their
    // pages back, so that l5, of the same size, fits in the room l4 took plus 1 MiB.
    if (Status st = remove_local(*comm, root, tier, "l3"); !st.ok()) return report(st);
    internal_storage::FaultSpec fill_before_record;
    fill_before_record.hook = [filler](const std::string& fs_op, const std::string& path) {
      if (fs_op == "create" && path.find(".tmp-") != std::string::npos && path.find("/record") != std::string::npos)
        fill_disk(filler, false);
    };
    auto filling = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), fill_before_record);
    if (save_as(m, "l4", filling).ok()) return report(internal_error("l4 committed on a full disk"));
    if (comm->rank() == 0)
      std::filesystem::resize_file(filler, std::filesystem::file_size(filler) - (1 << 20));
    MPI_Barrier(MPI_COMM_WORLD);
    if (Status st = save_as(m, "l5"); !st.ok())
      return report(st.with_context("save l5 in the room of the failed l4 (its pages were not given back?)"));
    if (Status st = restores(mib, "l5"); !st.ok()) return report(st.with_context("restore l5"));
    Model big(*comm, 2 * mib);
    const Status failed = save_as(big, "big");
    if (failed.ok()) return report(internal_error("a save of twice the size fitted on a full disk"));
    if (Status st = restores(mib, "l5"); !st.ok()) return report(st.with_context("restore l5 after the failed save"));
    return report(failed.with_context("save big"));  // the one failure expected
  }
  if (op == "load" && argc == 5) {
    Model m(*comm, std::stoll(argv[4]));
    m.zero();
    auto loaded = load(*comm, m.state, std::string(argv[2]) + "/" + argv[3], {});
    if (!loaded.ok()) return report(loaded.status());
    const bool same = comm->allreduce_one(m.check(*comm) ? 0 : 1, ReduceOp::kMax) == 0;
    return report(same ? Status() : corruption("load: the values differ from what was saved"));
  }
  if (op == "fill-at" && argc == 7) {
    const std::string spec = argv[2];
    const std::string filler = argv[3];
    const auto colon = spec.find(':');
    internal_storage::FaultSpec fault;
    auto filled = std::make_shared<std::atomic<bool>>(false);
    fault.hook = [op_name = spec.substr(0, colon), pattern = spec.substr(colon + 1), filler, filled](
                     const std::string& fs_op, const std::string& path) {
      if (fs_op == op_name && path.find(pattern) != std::string::npos && !filled->exchange(true)) fill_disk(filler);
    };
    Model m(*comm, std::stoll(argv[6]));
    SaveOptions o;
    o.name = argv[5];
    o.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), fault);
    auto saved = save(*comm, m.state, argv[4], o);
    return report(saved.status(), saved.ok() ? saved->warning : "");
  }
  if ((op == "manager" && (argc == 5 || argc == 6)) || (op == "retain" && argc == 5)) {
    const bool retain = op == "retain";
    const std::string root = retain ? argv[3] : argv[2];
    Model m(*comm, std::stoll(argv[4]));
    CheckpointConfig c;
    c.directory = root;
    c.prefix = "m";
    c.name_template = "{prefix}-{step}";
    c.keep_max = retain ? 1 : (argc == 6 ? std::stoi(argv[5]) : 0);
    if (retain) {
      // The disk really fills just before retention renames m-1 away (after m-2's commit).
      internal_storage::FaultSpec fault;
      auto filled = std::make_shared<std::atomic<bool>>(false);
      fault.hook = [filler = std::string(argv[2]), filled](const std::string& fs_op, const std::string& path) {
        if (fs_op == "rename" && path.size() >= 4 && path.compare(path.size() - 4, 4, "/m-1") == 0 &&
            !filled->exchange(true))
          fill_disk(filler);
      };
      c.fs = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), fault);
    }
    auto manager = CheckpointManager::create(*comm, m.state, c);
    if (!manager.ok()) return report(manager.status());
    if (!retain) return report((*manager)->save_now(std::stoll(argv[3]), 0).status());
    for (int64_t step = 1; step <= 2; ++step) {
      auto out = (*manager)->save_now(step, 0);
      if (!out.ok()) return report(out.status());
      if (step == 2) {
        std::string removed;
        for (const auto& r : out->removed) removed += (removed.empty() ? "" : ",") + r;
        return report(Status(), "committed " + out->path + "; retention removed " + removed);
      }
    }
  }
  std::fprintf(stderr, "realfs_ops: bad arguments (see the top of tests/realfs/realfs_ops.cc)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rc = argc < 2 ? 2 : run(argc, argv);
  MPI_Finalize();
  return rc;
}
