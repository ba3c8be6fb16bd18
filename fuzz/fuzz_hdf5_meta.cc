// The 'distckpt' attribute of an HDF5 file: JSON metadata (layouts, info, tensor order)
// checked against the file's datasets, as hdf5_index does after reading the attribute.
// The datasets are fixed here (two tensors of a 4 KiB file); the HDF5 structure itself
// is parsed by the HDF5 library, not by distckpt.
#include "format/hdf5/hdf5_io.h"
#include "format/describe.h"
#include "format/metadata_json.h"
#include "format/stored.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace distckpt;
  auto meta = internal_format::parse_metadata_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!meta.ok()) return 0;
  constexpr uint64_t kFileSize = 4096;
  proto::Index index = internal_format::describe_single_file(*meta, "hdf5", "none", "fuzz.h5", kFileSize);
  std::map<std::string, proto::Tensor> found;
  found.emplace("w", internal_format::whole_tensor("w", DType::kFloat32, {4, 8}, 2048, 128));
  found.emplace("b", internal_format::whole_tensor("b", DType::kInt64, {3}, 2176, 24));
  if (!internal_format::attach_tensors(index, std::move(found), {"w", "b"}, *meta, "fuzz.h5").ok()) return 0;
  fuzz::check_accepted(index);
  return 0;
}
