// The native index (index.pb): frame, version, CRC32C, protobuf, every number in it.
// An input that does not start with the frame's magic is taken as a payload and framed
// with a correct checksum, so that mutations reach the semantic checks instead of
// stopping at the CRC.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.rfind("DCKPTIDX", 0) != 0) bytes = internal_storage::frame_payload(bytes);
  auto index = internal_storage::parse_index(bytes, "fuzz/index.pb");
  if (index.ok()) fuzz::check_accepted(*index);
  return 0;
}
