// The `latest` pointer: a checkpoint name that must stay inside the root directory.
#include "fuzz_util.h"
#include "catalog/listing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  const std::string name = internal_catalog::parse_latest_pointer(std::string(reinterpret_cast<const char*>(data), size));
  if (name.empty()) return 0;
  // Whatever is accepted is one plain path component.
  if (name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
    std::abort();
  return 0;
}
