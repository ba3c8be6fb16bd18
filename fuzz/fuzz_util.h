// Shared by the fuzz targets: the input as a file, and the checks every parser's
// result must pass (a description that load would accept is internally consistent).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "distckpt/filesystem.h"
#include "plan/load_plan.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "tools/inspect.h"

// Included once per fuzz target (each is its own program): silences protobuf, which
// logs every invalid UTF-8 string a hostile input contains.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

namespace distckpt::fuzz {

// The fuzzer's bytes as a read-only file.
class MemoryFile final : public ReadableFile {
 public:
  MemoryFile(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  Status read_at(void* out, std::size_t n, uint64_t offset) const override {
    if (offset > size_ || n > size_ - offset) return corruption("read past the end of the input");
    if (n > 0) std::memcpy(out, data_ + offset, n);
    return Status();
  }
  Result<uint64_t> size() const override { return static_cast<uint64_t>(size_); }

 private:
  const uint8_t* data_;
  std::size_t size_;
};

// What a parser accepted must be what load accepts and plans: validate_index passes,
// the summary can be built, and every tensor's chunks cover it (validate_index checked
// the tiling, so a lookup that misses an element is a planner bug: abort so the
// fuzzer reports the input).
inline void check_accepted(const proto::Index& index) {
  if (!internal_format::validate_index(index, "fuzz").ok()) std::abort();
  (void)internal_tools::to_checkpoint_info(index, "fuzz");
  for (const auto& t : index.tensors()) {
    const Box whole = full_box(Shape(t.global_shape().begin(), t.global_shape().end()));
    int64_t covered = 0;
    (void)internal_plan::ChunkLookup(t).plan_reads(whole, &covered);
    if (covered != whole.num_elements()) std::abort();
  }
}

}  // namespace distckpt::fuzz
