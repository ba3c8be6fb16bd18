// convert_checkpoint: read region by region (tools/reader.h), write sequentially
// (format/writers.h) or as HDF5 hyperslabs, commit like a save without moving `latest`.
#include "tools/convert.h"

#include <algorithm>
#include <chrono>

#include "distckpt/checkpoint.h"
#include "format/hdf5/hdf5_io.h"
#include "format/stored.h"
#include "format/writers.h"
#include "layout/region.h"
#include "catalog/commit.h"
#include "base/guard.h"
#include "catalog/listing.h"
#include "tools/reader.h"
#include "format/native/index_io.h"
#include "transform/cipher.h"

namespace distckpt {
namespace internal_runtime {

bool name_selected(const std::string& name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& p : only)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

Result<ConvertResult> convert_to(const std::string& src, const std::string& dst, Format to,
                                 const ConvertOptions& options, const ConvertControl& control) {
  return guarded("convert", [&]() -> Result<ConvertResult> {
    std::shared_ptr<FileSystem> fs = options.fs ? options.fs : posix_filesystem();
    DISTCKPT_RETURN_IF_ERROR(options.encryption.validate());
    if (options.encryption.enabled()) DISTCKPT_RETURN_IF_ERROR(internal_format::encryption_refused(to));
    DISTCKPT_ASSIGN_OR_RETURN(auto reader, internal_runtime::CheckpointReader::open(fs, src, options.key.get()));
    const proto::Index& index = reader->index();
    // Native chunks are checked as they are read (whole chunks). A single file's
    // checksums cover the whole file (ckpt footer) or whole tensors (safetensors), which
    // region reads do not: check them all first, so a damaged file is never converted
    // into one with fresh, valid checksums.
    const bool single = !(index.format().empty() || index.format() == "native");
    bool has_checksums = index.transforms().checksum() == "crc32c";
    for (const auto& f : index.files()) has_checksums |= f.crc32_covered() > 0;
    if (single && has_checksums) {
      DISTCKPT_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(src, fs));
      VerifyOptions verify;
      verify.key = options.key;
      DISTCKPT_RETURN_IF_ERROR(verify_checkpoint(resolved, verify, fs).status().with_context("convert: source"));
    }
    // <root>/<name>: the destination and the directory it is committed in.
    std::string path = dst;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string ext(internal_format::format_extension(to));
    if (!ext.empty() && (path.size() < ext.size() || path.compare(path.size() - ext.size(), ext.size(), ext) != 0))
      path += ext;
    const auto slash = path.find_last_of('/');
    const std::string root = slash == std::string::npos ? "." : path.substr(0, slash);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    DISTCKPT_RETURN_IF_ERROR(internal_storage::validate_checkpoint_name(name));
    DISTCKPT_RETURN_IF_ERROR(fs->create_dirs(root));
    if (control.commit && fs->exists(path)) return already_exists("convert: '" + path + "' already exists");

    // The tensors converted: all, or those `only` selects (each entry must select one).
    for (const auto& p : options.only) {
      bool any = false;
      for (const auto& t : index.tensors()) any |= t.name().rfind(p, 0) == 0;
      if (!any) return invalid_argument("convert: '" + p + "' names no tensor of '" + src + "'");
    }
    std::vector<int> selected;
    for (int t = 0; t < index.tensors_size(); ++t)
      if (name_selected(index.tensors(t).name(), options.only)) selected.push_back(t);
    proto::Index meta = internal_format::metadata_of(index);
    if (selected.size() != static_cast<std::size_t>(index.tensors_size())) {
      proto::Index all = meta;
      meta.clear_tensors();
      for (int t : selected) *meta.add_tensors() = all.tensors(t);
    }
    meta.set_name(control.meta_name.empty() ? name : control.meta_name);
    meta.set_format(std::string(format_name(to)));
    meta.mutable_transforms()->set_checksum(to == Format::kNative ? "crc32c" : "none");
    if (to == Format::kCkpt) {
      if (meta.epoch() >= 0 && !meta.info().count("epoch_num")) (*meta.mutable_info())["epoch_num"].set_int_value(meta.epoch());
      if (meta.step() >= 0 && !meta.info().count("step_num")) (*meta.mutable_info())["step_num"].set_int_value(meta.step());
    }
    meta.set_advances_latest(false);
    if (control.reproducible) {
      // No clock and no directory state in the bytes: equal tensors give equal files.
      meta.set_commit_seq(0);
      meta.set_created_unix_ms(0);
    } else {
      meta.set_commit_seq(next_commit_seq(*fs, root));
      meta.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count());
    }
    DISTCKPT_RETURN_IF_ERROR(internal_format::check_writable(to, meta));

    // A native source is read a stored chunk at a time at least (each chunk's CRC32C is
    // checked as a whole), so regions are not cut finer than its largest chunk.
    uint64_t budget = std::max<uint64_t>(options.region_bytes, 1);
    uint64_t total = 0;
    for (int i : selected) {
      const proto::Tensor& t = index.tensors(i);
      const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
      total += static_cast<uint64_t>(full_box({t.global_shape().begin(), t.global_shape().end()}).num_elements()) * item;
      // Chunks read whole (native ones, and every encrypted one) are read once each when
      // a region holds at least the largest.
      if (index.format().empty() || index.format() == "native" || index.has_encryption())
        for (const auto& c : t.chunks()) budget = std::max<uint64_t>(budget, c.length());
    }

    ConvertResult result;
    result.path = path;
    const std::string tmp = make_tmp_dir_name(root, name);
    std::unique_ptr<internal_format::SequentialWriter> writer;
    std::unique_ptr<internal_format::Hdf5Writer> hdf5;
    auto cleanup = [&] {
      writer.reset();
      hdf5.reset();
      if (to == Format::kNative) (void)fs->remove_all(tmp);
      else (void)fs->remove_file(tmp);
    };
    // An encrypted destination: fresh salt, so fresh keys and nonces.
    std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
    std::string salt;
    if (options.encryption.enabled()) {
      DISTCKPT_ASSIGN_OR_RETURN(salt, internal_transform::CheckpointCipher::random_bytes(internal_transform::kSaltBytes));
      DISTCKPT_ASSIGN_OR_RETURN(cipher, internal_transform::CheckpointCipher::create(options.encryption.mode,
                                                                                    *options.encryption.key, salt));
    }
    Status st = [&]() -> Status {
      if (to == Format::kHdf5) {
        DISTCKPT_ASSIGN_OR_RETURN(hdf5, internal_format::Hdf5Writer::create(tmp, MPI_COMM_NULL, meta,
                                                                            internal_format::metadata_json(meta)));
      } else {
        if (to == Format::kNative) DISTCKPT_RETURN_IF_ERROR(fs->create_dir(tmp));
        const std::string file = to == Format::kNative ? tmp + "/" + internal_storage::data_file_name(0) : tmp;
        DISTCKPT_ASSIGN_OR_RETURN(writer, internal_format::make_sequential_writer(to, *fs, file, meta,
                                                                                  options.ckpt_crc_footer, cipher.get()));
      }
      std::vector<char> buf;
      for (int t = 0; t < static_cast<int>(selected.size()); ++t) {
        const int source_tensor = selected[t];
        const proto::Tensor& tensor = index.tensors(source_tensor);
        const std::size_t item = dtype_size(*dtype_from_name(tensor.dtype()));
        const auto blocks =
            internal_layout::row_blocks({tensor.global_shape().begin(), tensor.global_shape().end()}, item, budget);
        if (blocks.empty() && writer) DISTCKPT_RETURN_IF_ERROR(writer->append(t, nullptr, 0));  // an empty tensor
        for (const Box& region : blocks) {
          const std::size_t n = static_cast<std::size_t>(region.num_elements()) * item;
          buf.resize(n);
          DISTCKPT_RETURN_IF_ERROR(reader->read(source_tensor, region, buf.data(), &result.bytes_read));
          if (hdf5) DISTCKPT_RETURN_IF_ERROR(hdf5->write(t, {{region, buf.data()}}, 1));
          else DISTCKPT_RETURN_IF_ERROR(writer->append(t, buf.data(), n));
          result.bytes += n;
          if (options.progress) options.progress(result.bytes, total, tensor.name());
        }
      }
      Result<CommitResult> committed = CommitResult{};
      if (hdf5) {
        DISTCKPT_RETURN_IF_ERROR(hdf5->finish());
        hdf5.reset();
        if (options.fsync) DISTCKPT_RETURN_IF_ERROR(fs->sync_file(tmp));
        if (!control.commit) return Status();
        committed = publish_checkpoint(*fs, root, tmp, name, options.fsync, false);
      } else {
        DISTCKPT_ASSIGN_OR_RETURN(proto::Index written, writer->finish(options.fsync));
        writer.reset();
        if (to == Format::kNative) {
          written.set_world_size(std::max(written.world_size(), 1));
          if (!control.commit) return unsupported("convert: a native checkpoint is always committed");
          if (cipher) DISTCKPT_RETURN_IF_ERROR(internal_storage::seal_index(&written, *cipher, salt));
          committed = commit_checkpoint(*fs, root, tmp, name, written, options.fsync, false);
        } else {
          if (!control.commit) return Status();
          committed = publish_checkpoint(*fs, root, tmp, name, options.fsync, false);
        }
      }
      return committed.status();
    }();
    if (!st.ok()) {
      if (fs->exists(tmp)) cleanup();
      return st.with_context("convert '" + src + "' -> '" + path + "'");
    }
    if (!control.commit) result.path = tmp;
    return result;
  });
}

}  // namespace internal_runtime

Result<ConvertResult> convert_checkpoint(const std::string& src, const std::string& dst, Format to,
                                         const ConvertOptions& options) {
  return internal_runtime::convert_to(src, dst, to, options, {});
}

}  // namespace distckpt
