#include "tools/reader.h"

#include <map>

#include "distckpt/inspect.h"
#include "format/chunk_reader.h"
#include "format/format.h"
#include "format/native/sealing.h"
#include "format/stored.h"
#include "plan/load_plan.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt::internal_tools {

struct CheckpointReader::Impl {
  std::shared_ptr<FileSystem> fs;
  std::string dir;
  proto::Index index;
  std::unique_ptr<internal_format::FileCache> files;
  std::vector<char> scratch;
  std::map<int, internal_plan::ChunkLookup> lookups;  // built on first use
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;  // encrypted sources
  bool files_checked = false;  // check_files() passed
};

CheckpointReader::CheckpointReader() = default;
CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(std::shared_ptr<FileSystem> fs, const std::string& path,
                                                                 const EncryptionKey* key) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  m.fs = internal_format::with_key(internal_storage::filesystem_for(path, fs), key);
  DISTCKPT_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path, {.fs = m.fs}));
  DISTCKPT_ASSIGN_OR_RETURN(m.index, internal_format::read_stored_index(*m.fs, resolved));
  DISTCKPT_ASSIGN_OR_RETURN(m.cipher, internal_format::open_index(&m.index, key, resolved));
  m.dir = internal_format::files_dir(m.index, resolved);
  m.files = std::make_unique<internal_format::FileCache>(*m.fs, m.dir, m.index);
  return r;
}

const proto::Index& CheckpointReader::index() const { return impl_->index; }

std::string CheckpointReader::unchecked_reason() const {
  const Impl& m = *impl_;
  const std::string file = m.index.files_size() == 1 ? m.dir + "/" + m.index.files(0).name() : m.dir;
  if (std::string cbc = internal_format::unauthenticated_encryption(m.index, file); !cbc.empty()) return cbc;
  if (m.cipher || internal_format::authenticated_whole_file(m.index) || internal_format::has_chunk_checksums(m.index) ||
      m.files_checked)
    return "";
  const std::string what = internal_format::is_single_file(m.index) && m.index.files_size() == 1
                               ? m.dir + "/" + m.index.files(0).name()
                               : m.dir;
  if (internal_format::has_file_crc32(m.index))
    return "'" + what + "': only a whole-file CRC-32 footer covers its data, which reads of single tensors do not "
           "check (open it with check=True to check the files first)";
  return "'" + what + "': " + internal_format::data_checks_text(m.index) + ": its data is not checked";
}

Status CheckpointReader::check_files() {
  Impl& m = *impl_;
  if (m.files_checked) return Status();
  for (int f = 0; f < m.index.files_size(); ++f) {
    const auto& meta = m.index.files(f);
    if (meta.crc32_covered() == 0) continue;
    DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, m.files->get(static_cast<uint32_t>(f)));
    DISTCKPT_ASSIGN_OR_RETURN(uint32_t crc, internal_format::file_crc32(*file, 0, meta.crc32_covered()));
    if (crc != meta.crc32())
      return corruption("'" + m.files->path(static_cast<uint32_t>(f)) + "': CRC-32 " +
                        internal_transform::crc32c_hex(crc) + " != footer " + internal_transform::crc32c_hex(meta.crc32()) +
                        " (the file was modified or damaged)");
  }
  m.files_checked = internal_format::has_file_crc32(m.index);
  return Status();
}

Status CheckpointReader::read(int tensor, const Box& region, void* dst, uint64_t* bytes_read, bool check_partial) {
  if (tensor < 0 || tensor >= impl_->index.tensors_size())
    return invalid_argument("read: no tensor number " + std::to_string(tensor));
  const proto::Tensor& t = impl_->index.tensors(tensor);
  // The region must be a box of the tensor: the lookups index its dims.
  const int dims = t.global_shape_size();
  bool inside = static_cast<int>(region.offset.size()) == dims && static_cast<int>(region.shape.size()) == dims;
  for (int d = 0; inside && d < dims; ++d)
    inside = region.offset[static_cast<std::size_t>(d)] >= 0 && region.shape[static_cast<std::size_t>(d)] >= 0 &&
             region.shape[static_cast<std::size_t>(d)] <= t.global_shape(d) - region.offset[static_cast<std::size_t>(d)];
  if (!inside)
    return invalid_argument("read: tensor '" + t.name() + "': region " + region.to_string() + " is not inside its " +
                            std::to_string(dims) + "-d shape");
  auto it = impl_->lookups.find(tensor);
  if (it == impl_->lookups.end()) it = impl_->lookups.emplace(tensor, internal_plan::ChunkLookup(t)).first;
  int64_t covered = 0;
  const auto reads = it->second.plan_reads(region, &covered);
  if (covered != region.num_elements())
    return corruption("tensor '" + t.name() + "': the checkpoint does not cover " + region.to_string());
  return internal_format::read_into(*impl_->files, impl_->index, t, reads, region, dst, impl_->scratch, bytes_read,
                   check_partial, impl_->cipher.get());
}

}  // namespace distckpt::internal_tools
