// distckpt::Reader (include/distckpt/reader.h): the public face of the one-process reader
// that `distckpt convert` streams through (tools/reader.h).
#include "distckpt/reader.h"

#include <map>

#include "tools/inspect.h"
#include "tools/reader.h"

namespace distckpt {

struct Reader::Impl {
  std::unique_ptr<internal_tools::CheckpointReader> reader;
  CheckpointInfo info;
  std::map<std::string, int> by_name;  // stored name -> index order
  bool check_partial = true;
};

Reader::Reader() : impl_(std::make_unique<Impl>()) {}
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;
Reader::~Reader() = default;

Result<Reader> Reader::open(const std::string& path, const ReaderOptions& options) {
  Reader r;
  DISTCKPT_ASSIGN_OR_RETURN(r.impl_->reader,
                            internal_tools::CheckpointReader::open(options.fs, path, options.key.get()));
  const auto& index = r.impl_->reader->index();
  r.impl_->info = internal_tools::to_checkpoint_info(index, path);
  for (int t = 0; t < index.tensors_size(); ++t) r.impl_->by_name.emplace(index.tensors(t).name(), t);
  r.impl_->check_partial = options.check_partial_chunks;
  return r;
}

const CheckpointInfo& Reader::info() const { return impl_->info; }

const TensorInfo* Reader::tensor(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->info.tensors[static_cast<std::size_t>(it->second)];
}

Status Reader::read(const std::string& name, void* dst, std::size_t dst_bytes) {
  const TensorInfo* t = tensor(name);
  if (t == nullptr) return not_found("reader: no tensor '" + name + "' in " + impl_->info.path);
  return read(name, full_box(t->global_shape), dst, dst_bytes);
}

Status Reader::read(const std::string& name, const Box& region, void* dst, std::size_t dst_bytes) {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return not_found("reader: no tensor '" + name + "' in " + impl_->info.path);
  const TensorInfo& t = impl_->info.tensors[static_cast<std::size_t>(it->second)];
  const auto elements = region.num_elements();
  if (elements < 0 || static_cast<uint64_t>(elements) * dtype_size(t.dtype) != dst_bytes)
    return invalid_argument("reader: tensor '" + name + "': a buffer of " + std::to_string(dst_bytes) +
                            " bytes for the region " + region.to_string() + " of " +
                            std::string(dtype_name(t.dtype)) + " elements");
  uint64_t bytes_read = 0;
  return impl_->reader->read(it->second, region, dst, &bytes_read, impl_->check_partial);
}

std::string Reader::unchecked_reason() const { return impl_->reader->unchecked_reason(); }

Status Reader::check_files() { return impl_->reader->check_files(); }

}  // namespace distckpt
