// A safetensors file: the 8-byte header length, the JSON header (dtypes, shapes,
// offsets), its __metadata__ with distckpt's description.
#include "format/safetensors/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  const fuzz::MemoryFile file(data, size);
  auto index = internal_format::safetensors_index(file, size, "fuzz.safetensors", "fuzz.safetensors");
  if (index.ok()) fuzz::check_accepted(*index);
  return 0;
}
