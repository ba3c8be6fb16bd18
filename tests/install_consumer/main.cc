// A program outside the tree that uses an installed distckpt through
// find_package(distckpt): saves and loads one tensor under mpirun, saves it as HDF5 too,
// and reads both back with the one-process reader.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) return 2;  // CKPT_ROOT [PREFIX: the install's, for its HDF5 reader]
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
  if (st.ok()) {  // an HDF5 file too, which reads go through the install's helper program
    distckpt::SaveOptions opts;
    opts.name = "consumer_h5";
    opts.format = distckpt::Format::kHdf5;
    st = distckpt::save(*comm, sd, argv[1], opts).status();
  }
  // The installed one-process reader reads both back, the .h5 with the reader program of
  // the install this program was built against (moved since it was installed).
  std::vector<float> read_back(8, 0.0f);
  for (const std::string name : {"consumer", "consumer_h5.h5"}) {
    if (!st.ok() || comm->rank() != 0) break;
    read_back.assign(8, 0.0f);
    auto reader = distckpt::Reader::open(std::string(argv[1]) + "/" + name);
    st = reader.ok() ? reader->read("w", read_back.data(), read_back.size() * sizeof(float)) : reader.status();
    if (st.ok() && read_back[7] != 1.5f) st = distckpt::internal_error(name + ": the reader read other values");
  }
  if (st.ok() && comm->rank() == 0 && argc == 3 &&
      distckpt::hdf5_reader_program().rfind(argv[2], 0) != 0)  // the package's, not the build tree's
    st = distckpt::internal_error("HDF5 reader program " + distckpt::hdf5_reader_program() + " is not under " + argv[2]);
  const bool ok = st.ok() && w[7] == 1.5f;
  std::printf("rank %d: %s\n", comm->rank(), ok ? "ok" : st.to_string().c_str());
  comm.reset();
  MPI_Finalize();
  return ok ? 0 : 1;
}
