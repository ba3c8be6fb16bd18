// The native index (index.pb): frame, version, CRC32C, protobuf, every number in it.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  auto index = internal_storage::parse_index(std::string(reinterpret_cast<const char*>(data), size), "fuzz/index.pb");
  if (index.ok()) fuzz::check_accepted(*index);
  return 0;
}
