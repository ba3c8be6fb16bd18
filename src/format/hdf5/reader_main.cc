// distckpt-hdf5-reader: libhdf5 parses an .h5 file here, in a process of its own, so
// that a damaged or hostile file cannot crash or hang the job that asked (hdf5_io.cc).
#include "format/hdf5/hdf5_io.h"

int main(int argc, char** argv) { return distckpt::internal_format::hdf5_reader_main(argc, argv); }
