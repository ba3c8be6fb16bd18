// A MindSpore .ckpt file: protobuf records (tags, dims, types, contents), distckpt's
// meta field, the CRC-32 footer, and an encrypted file's encryption field and seal.
#include "format/ckpt/ms_ckpt.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  const fuzz::MemoryFile file(data, size);
  auto scan = internal_format::scan_ckpt(file, size, "fuzz.ckpt");
  if (!scan.ok()) return 0;
  auto index = internal_format::ckpt_index(*scan, "fuzz.ckpt", size, "fuzz.ckpt");
  if (!index.ok()) return 0;
  fuzz::check_accepted(*index);
  if (index->has_encryption()) {  // the seal, with the key of the encrypted seed (32 bytes 'F')
    static const EncryptionKey key = *EncryptionKey::from_bytes(std::string(32, 'F'));
    proto::Index opened = *index;
    (void)internal_format::open_index(&opened, &key, "fuzz.ckpt");
  }
  return 0;
}
