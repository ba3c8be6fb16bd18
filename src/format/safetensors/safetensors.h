// safetensors: u64 little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value", ...}}, padded with spaces so that the data starts
// 8-byte aligned, then the tensors' bytes (offsets relative to the data start).
//
// distckpt writes tensors largest element size first, so each starts aligned to its
// own element size, and puts its metadata (step, epoch, layouts, typed info values and
// one CRC32C per tensor) as JSON under __metadata__["distckpt"], plus every info value
// as a plain string for other readers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/dtype.h"
#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // the reference implementation's limit
inline constexpr const char* kSafetensorsMetaKey = "distckpt";

std::string_view st_dtype_name(DType t);  // "F32", "BF16", "BOOL", ...
std::optional<DType> st_dtype_from_name(std::string_view name);

struct SafetensorsLayout {
  uint64_t header_bytes = 0;             // reserved JSON length (data starts at 8 + this)
  std::vector<uint64_t> file_offset;     // per tensor of `meta`, absolute
  uint64_t file_size = 0;
};
// Places the tensors of `meta` (metadata_of an index) in the file. The header is
// reserved large enough for any CRC values, so it can be written after the data.
SafetensorsLayout plan_safetensors(const proto::Index& meta);
// The 8-byte length and the padded header for `meta` with its chunks' CRCs filled in.
Result<std::string> safetensors_header(const proto::Index& meta, const SafetensorsLayout& layout);

// Reads and checks the header of a safetensors file of `size` bytes (JSON, dtypes,
// shapes, offsets inside the file and not overlapping) and describes it as an index.
Result<proto::Index> safetensors_index(const ReadableFile& file, uint64_t size, const std::string& file_name,
                                       const std::string& path);

// The safetensors writer (safetensors_writer.cc), for the format table.
struct WriterOptions;
class SequentialWriter;
Result<std::unique_ptr<SequentialWriter>> open_safetensors_writer(FileSystem& fs, const std::string& path,
                                                                  const proto::Index& meta,
                                                                  const WriterOptions& options);

// The safetensors format's row of the format table (format.h).
const struct FormatDriver& safetensors_driver();

}  // namespace distckpt::internal_format
