// A program outside the tree that uses an installed distckpt through
// find_package(distckpt): saves and loads one tensor under mpirun, and reads it back with
// the one-process reader.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (std::string(distckpt::version()) != EXPECTED_VERSION) {
    std::printf("distckpt::version() %s != the package's %s\n", distckpt::version(), EXPECTED_VERSION);
    return 1;
  }
  MPI_Init(&argc, &argv);
  auto comm = distckpt::make_mpi_comm(MPI_COMM_WORLD);
  std::vector<float> w(8, 1.5f);
  distckpt::StateDict sd(comm->rank());
  auto layout = distckpt::TensorLayout::from_device_matrix({8}, {comm->size()}, {-1});
  distckpt::Status st = layout.ok() ? sd.add_tensor("w", distckpt::DType::kFloat32, w.data(), *layout) : layout.status();
  if (st.ok()) {
    distckpt::SaveOptions opts;
    opts.name = "consumer";
    st = distckpt::save(*comm, sd, argv[1], opts).status();
  }
  if (st.ok()) {
    w.assign(8, 0.0f);
    st = distckpt::load(*comm, sd, argv[1], {}).status();
  }
  // The installed one-process reader reads it back too.
  std::vector<float> read_back(8, 0.0f);
  if (st.ok() && comm->rank() == 0) {
    auto reader = distckpt::Reader::open(argv[1]);
    st = reader.ok() ? reader->read("w", read_back.data(), read_back.size() * sizeof(float)) : reader.status();
    if (st.ok() && read_back[7] != 1.5f) st = distckpt::internal_error("the reader read other values");
  }
  const bool ok = st.ok() && w[7] == 1.5f;
  std::printf("rank %d: %s\n", comm->rank(), ok ? "ok" : st.to_string().c_str());
  comm.reset();
  MPI_Finalize();
  return ok ? 0 : 1;
}
