#include "base/package.h"

#include <mutex>

#include "distckpt/package.h"

namespace distckpt {
namespace internal_base {
namespace {

// Built on first use: set_hdf5_reader_path is called from other translation units'
// static initializers, which may run before this one's.
struct RegisteredReader {
  std::mutex mu;
  std::string path;
};
RegisteredReader& registered_reader() {
  static RegisteredReader r;
  return r;
}

}  // namespace

std::string registered_hdf5_reader() {
  RegisteredReader& r = registered_reader();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.path;
}

}  // namespace internal_base

void set_hdf5_reader_path(const std::string& path) {
  internal_base::RegisteredReader& r = internal_base::registered_reader();
  std::lock_guard<std::mutex> lock(r.mu);
  r.path = path;
}

}  // namespace distckpt
