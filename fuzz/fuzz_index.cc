// The native index (index.pb): frame, version, CRC32C, protobuf, every number in it.
// An input that does not start with the frame's magic is taken as a payload and framed
// with a correct checksum, so that mutations reach the semantic checks instead of
// stopping at the CRC. An encrypted index is then opened with the key of the seed
// corpus's encrypted checkpoints (32 bytes 'F'): the checks before and after its
// authentication run on hostile input.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.rfind("DCKPTIDX", 0) != 0) bytes = internal_format::frame_payload(bytes);
  auto index = internal_format::parse_index(bytes, "fuzz/index.pb");
  if (!index.ok()) return 0;
  fuzz::check_accepted(*index);
  if (index->has_encryption()) {
    static const EncryptionKey key = *EncryptionKey::from_bytes(std::string(32, 'F'));
    proto::Index opened = *index;
    if (internal_format::open_index(&opened, &key, "fuzz").ok()) fuzz::check_accepted(opened);
  }
  return 0;
}
