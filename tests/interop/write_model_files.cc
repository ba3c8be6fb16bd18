// Writes the test model (tests/format_model.h) in every single-file format into DIR,
// plus each tensor's expected bytes (row-major) as DIR/expected/<name with '/'->'.'>.bin,
// for tests/interop/check.sh to compare with what h5dump, h5py and a plain safetensors
// reader see. One process, one rank.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comm/local_comm.h"
#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "format_model.h"

int main(int argc, char** argv) {
  using namespace distckpt;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/expected");
  int failures = 0;
  internal_comm::run_local_ranks(1, [&](Comm& comm) {
    distckpt::testing::FormatModel model(0, 1);
    for (Format f : {Format::kHdf5, Format::kSafetensors, Format::kCkpt}) {
      SaveOptions options;
      options.name = "model";
      options.step = 12;
      options.epoch = 3;
      options.format = f;
      auto r = save(comm, model.state, dir, options);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
        ++failures;
      }
    }
    for (const TensorEntry& e : model.state.tensors()) {
      std::string file = e.name;
      for (char& c : file)
        if (c == '/') c = '.';
      const auto bytes = distckpt::testing::full_tensor(e.name);
      std::ofstream(dir + "/expected/" + file + ".bin", std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  });
  return failures == 0 ? 0 : 1;
}
