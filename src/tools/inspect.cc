// read_checkpoint_info: what `distckpt inspect` shows, from any format's description.
#include "tools/inspect.h"

#include "distckpt/inspect.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "format/stored.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt {

namespace internal_tools {

CheckpointInfo to_checkpoint_info(const proto::Index& index, const std::string& path) {
  CheckpointInfo info;
  info.path = path;
  info.name = index.name();
  info.format_version = internal_format::index_version(index);
  info.format = internal_format::stored_format(index);
  info.per_rank_files = internal_format::is_per_rank_set(index);
  info.step = index.step();
  info.epoch = index.epoch();
  info.world_size = index.world_size();
  info.created_unix_ms = index.created_unix_ms();
  info.commit_seq = index.commit_seq();
  info.writer_version = index.writer_version();
  info.advances_latest = index.advances_latest();
  info.checksum = internal_format::has_chunk_checksums(index) ? Checksum::kCrc32c : Checksum::kNone;
  info.encryption = index.has_encryption() ? index.encryption().algorithm() : "none";
  info.encryption_mode = index.has_encryption()
                             ? encryption_mode_from_name(index.encryption().mode()).value_or(EncryptionMode::kNone)
                             : EncryptionMode::kNone;
  info.tensors_sealed = index.has_encryption() && index.tensors_size() == 0 && !internal_format::is_single_file(index);
  if (index.has_file_encryption()) {  // a .ckpt encrypted whole
    const proto::FileEncryption& e = index.file_encryption();
    info.encryption = (e.opened() ? e.algorithm() : e.mode()) + " (MindSpore framing)";
    info.encryption_mode = encryption_mode_from_name(e.mode()).value_or(EncryptionMode::kNone);
    info.tensors_sealed = !e.opened();
  }
  for (const auto& f : index.files()) info.files.push_back(FileInfo{f.name(), f.size(), f.checkpoint()});
  for (const auto& t : index.tensors()) {
    TensorInfo ti;
    ti.name = t.name();
    ti.dtype = *dtype_from_name(t.dtype());
    ti.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
    ti.dev_mat.assign(t.layout().dev_mat().begin(), t.layout().dev_mat().end());
    ti.tensor_map.assign(t.layout().tensor_map().begin(), t.layout().tensor_map().end());
    ti.ranks.assign(t.layout().ranks().begin(), t.layout().ranks().end());
    if (ti.ranks.empty() && !ti.dev_mat.empty()) {  // stored compactly: the contiguous run from ranks_first
      int64_t group = 1;
      for (int64_t d : ti.dev_mat) group *= d;  // bounded by validate_index
      ti.ranks.resize(static_cast<std::size_t>(group));
      for (int64_t i = 0; i < group; ++i) ti.ranks[static_cast<std::size_t>(i)] = t.layout().ranks_first() + static_cast<int>(i);
    }
    for (const auto& c : t.chunks()) {
      ChunkInfo ci;
      ci.box.offset.assign(c.offset().begin(), c.offset().end());
      ci.box.shape.assign(c.shape().begin(), c.shape().end());
      const proto::File& file = index.files(static_cast<int>(c.file_id()));
      ci.file = file.checkpoint().empty() ? file.name() : "../" + file.checkpoint() + "/" + file.name();
      ci.byte_offset = c.byte_offset();
      ci.length = c.length();
      ci.crc32c = c.crc32c();
      ci.writer_rank = c.writer_rank();
      ti.chunks.push_back(std::move(ci));
    }
    info.tensors.push_back(std::move(ti));
  }
  info.info = internal_format::info_values(index);
  return info;
}

}  // namespace internal_tools

Result<CheckpointInfo> read_checkpoint_info(const std::string& path, const InspectOptions& options) {
  const std::shared_ptr<const EncryptionKey>& key = options.key;
  const std::shared_ptr<FileSystem> fs = internal_format::with_key(internal_storage::filesystem_for(path, options.fs), key.get());
  DISTCKPT_ASSIGN_OR_RETURN(auto index, internal_format::read_stored_index(*fs, path));
  if (key) DISTCKPT_RETURN_IF_ERROR(internal_format::open_index(&index, key.get(), path).status());
  CheckpointInfo info = internal_tools::to_checkpoint_info(index, path);
  if (key) info.tensors_sealed = false;  // opened (an empty table is still an empty table)
  return info;
}

uint64_t CheckpointInfo::data_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files) total += f.size;
  return total;
}

}  // namespace distckpt
