// convert_checkpoint: read region by region (tools/reader.h), write with the destination
// format's sequential writer (format/sequential_writer.h), commit like a save (the local
// frame of catalog/commit.h) without moving `latest`.
#include "tools/convert.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "base/guard.h"
#include "base/strings.h"
#include "base/test_seams.h"
#include "catalog/commit.h"
#include "catalog/names.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "format/describe.h"
#include "format/format.h"
#include "format/native/file_names.h"
#include "format/native/sealing.h"
#include "format/sequential_writer.h"
#include "plan/load_names.h"
#include "layout/region.h"
#include "tools/reader.h"
#include "transform/cipher.h"
#include "catalog/claims.h"
#include "format/stored.h"
#include "storage/object_fs.h"
#include "storage/s3_config.h"

namespace distckpt {
namespace internal_tools {

bool name_selected(const std::string& name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& p : only) {
    if (internal_base::starts_with(name, p)) return true;
    // "model." also names the tensor "model" itself (a key whose value is one tensor).
    if (!p.empty() && p.back() == '.' && name.size() + 1 == p.size() && internal_base::starts_with(p, name)) return true;
  }
  return false;
}

namespace {

// A single file's checksums cover the whole file (ckpt footer) or whole tensors
// (safetensors), which region reads do not: they are all checked first, so a damaged
// file is never converted into one with fresh, valid checksums. (Native chunks are
// checked as they are read: whole chunks.)
Status check_single_source(const std::shared_ptr<FileSystem>& fs, const std::string& src, const proto::Index& index,
                           const ConvertOptions& options) {
  bool has_checksums = internal_format::has_chunk_checksums(index);
  for (const auto& f : index.files()) has_checksums |= f.crc32_covered() > 0;
  if (!internal_format::is_single_file(index) || !has_checksums) return Status();
  DISTCKPT_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(src, {.fs = fs, .key = options.key}));
  VerifyOptions verify;
  verify.fs = fs;
  verify.key = options.key;
  return verify_checkpoint(resolved, verify).status().with_context("convert: source");
}

// Never into a checkpoint's directory (the source's or another's): that directory is
// its checkpoint's alone, and retention or rm would remove the copy with it.
Status refuse_inside_checkpoint(FileSystem& fs, const std::string& path, const std::string& root) {
  for (std::filesystem::path up = std::filesystem::absolute(root).lexically_normal(); !up.empty();
       up = up.parent_path()) {
    if (fs.exists((up / internal_format::kIndexFileName).string()) ||
        fs.exists((up / internal_format::kRetiredIndexFileName).string())) {
      std::error_code no_cwd;
      const auto cwd = std::filesystem::current_path(no_cwd);
      const auto shown = no_cwd ? up : up.lexically_relative(cwd);  // as the caller named it, where it can
      return invalid_argument("convert: the destination '" + path + "' is inside the checkpoint '" +
                              (shown.empty() || *shown.begin() == ".." ? up : shown).string() +
                              "' (a checkpoint's directory is its own: rm and retention remove it whole)");
    }
    if (up == up.root_path()) break;
  }
  return Status();
}

// Every only/exclude/rename entry must name a tensor: a typo would keep or drop silently.
Status check_selection_names(const proto::Index& index, const ConvertOptions& options, const std::string& src) {
  for (const auto* list : {&options.only, &options.exclude})
    for (const auto& p : *list) {
      bool any = false;
      for (const auto& t : index.tensors()) any |= name_selected(t.name(), {p});
      if (!any)
        return invalid_argument(std::string("convert: ") + (list == &options.exclude ? "exclude " : "") + "'" + p +
                                "' names no tensor of '" + src + "'");
    }
  for (const auto& [from, to_name] : options.rename) {
    bool any = false;
    for (const auto& t : index.tensors()) any |= t.name() == from;
    if (!any) return invalid_argument("convert: --rename '" + from + "' names no tensor of '" + src + "'");
  }
  // As a load's specify_prefix and filter_prefix: an entry may not be in both.
  for (const auto& o : options.only)
    for (const auto& e : options.exclude)
      if (!o.empty() && (o.compare(0, e.size(), e) == 0 || e.compare(0, o.size(), o) == 0))
        return invalid_argument("convert: only '" + o + "' and exclude '" + e + "' overlap");
  return Status();
}

struct Selection {
  std::vector<int> tensors;         // source tensors converted, in the source's order
  std::map<int, std::string> name;  // source tensor -> its name in the copy
};

// The tensors converted, with the same selection and renames as a load (LoadOptions), in
// the source's order; `only` by name_selected ("x." names "x" too). An empty `only`
// entry selects everything.
Result<Selection> select_tensors(const proto::Index& index, const ConvertOptions& options, const std::string& src) {
  DISTCKPT_RETURN_IF_ERROR(check_selection_names(index, options, src));
  LoadOptions select;
  if (std::find(options.only.begin(), options.only.end(), std::string()) == options.only.end())
    select.choice_func = [&options](const std::string& name) { return name_selected(name, options.only); };
  select.filter_prefix = options.exclude;
  select.rename = options.rename;
  auto names = internal_plan::load_names(index, select);
  if (!names.ok()) return names.status().with_context("convert (--only/--exclude/--rename)");
  Selection out;
  for (const auto& [new_name, t] : names->by_state_name) out.name[t] = new_name;
  for (const auto& [t, new_name] : out.name) out.tensors.push_back(t);
  if (out.tensors.empty() && (!options.only.empty() || !options.exclude.empty()))
    return invalid_argument("convert: only/exclude leave no tensor of '" + src + "'");
  for (const auto& [from, to_name] : options.rename) {
    bool kept = false;
    for (int t : out.tensors) kept |= index.tensors(t).name() == from;
    if (!kept) return invalid_argument("convert: rename '" + from + "': that tensor is not converted (only/exclude)");
  }
  return out;
}

// The copy's metadata: the source's, with the selected tensors under their new names.
proto::Index copy_metadata(const proto::Index& index, const Selection& selection,
                           const internal_format::FormatDriver& format, const std::string& name) {
  proto::Index meta = internal_format::metadata_of(index);
  const proto::Index all = meta;
  meta.clear_tensors();
  for (int t : selection.tensors) {
    proto::Tensor* copy = meta.add_tensors();
    *copy = all.tensors(t);
    copy->set_name(selection.name.at(t));
  }
  meta.set_name(name);
  meta.set_format(std::string(format.name));
  meta.mutable_transforms()->set_checksum(format.chunk_checksums ? "crc32c" : "none");
  if (format.add_format_info) format.add_format_info(meta);
  meta.set_advances_latest(false);
  return meta;
}

// The entry written: <root>/<name>.tmp-<id> (a directory for a native checkpoint).
Result<internal_catalog::Entry> open_entry(const std::shared_ptr<FileSystem>& fs, const std::string& path,
                                           const std::string& root, const std::string& name, bool directory,
                                           const ConvertOptions& options, const ConvertControl& control) {
  internal_catalog::Entry entry;
  if (!control.commit)  // an uncommitted file for the caller to name (publish)
    return internal_catalog::make_tmp_entry(*fs, root, name, false, "convert", fs);
  if (!options.replace_existing || !fs->exists(path))
    return internal_catalog::begin_entry(*fs, root, name, directory, "convert", fs);
  // --force: only a committed checkpoint is replaced, retired just before the new one
  // takes its name (rm's way: files later checkpoints reference stay until released).
  auto existing = internal_format::read_stored_summary(*fs, path);
  if (!existing.ok())
    return already_exists("convert: '" + path + "' exists and is not a committed checkpoint (" +
                          existing.status().to_string() + "): not replaced");
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t seq, internal_catalog::claim_commit_seq(*fs, root));
  DISTCKPT_ASSIGN_OR_RETURN(entry, internal_catalog::make_tmp_entry(*fs, root, name, directory, "convert", fs));
  entry.commit_seq = seq;
  entry.before_rename = [fs, root, name] { return remove_checkpoint(root, name, {.fs = fs}); };
  return entry;
}

// Bytes held at a time. A native source is read a stored chunk at a time at least (each
// chunk's CRC32C is checked as a whole), so regions are not cut finer than its largest
// chunk; chunks read whole (native ones, and every encrypted one) are then read once
// each. Also the selected tensors' total bytes.
uint64_t region_budget(const proto::Index& index, const Selection& selection, uint64_t region_bytes,
                       uint64_t* total) {
  uint64_t budget = std::max<uint64_t>(region_bytes, 1);
  *total = 0;
  for (int i : selection.tensors) {
    const proto::Tensor& t = index.tensors(i);
    *total += internal_format::tensor_bytes(t);
    if (!internal_format::is_single_file(index) || index.has_encryption())
      for (const auto& c : t.chunks()) budget = std::max<uint64_t>(budget, c.length());
  }
  return budget;
}

// Streams the selected tensors region by region into `writer`.
Status copy_tensors(CheckpointReader& reader, internal_format::SequentialWriter& writer, const Selection& selection,
                    uint64_t budget, uint64_t total, const ConvertOptions& options, ConvertResult* result) {
  const proto::Index& index = reader.index();
  std::vector<char> buf;
  for (int t = 0; t < static_cast<int>(selection.tensors.size()); ++t) {
    const int source_tensor = selection.tensors[static_cast<std::size_t>(t)];
    const proto::Tensor& tensor = index.tensors(source_tensor);
    const std::size_t item = dtype_size(*dtype_from_name(tensor.dtype()));
    const auto blocks =
        internal_layout::row_blocks({tensor.global_shape().begin(), tensor.global_shape().end()}, item, budget);
    if (blocks.empty()) DISTCKPT_RETURN_IF_ERROR(writer.append(t, nullptr, 0));  // an empty tensor
    for (const Box& region : blocks) {
      const std::size_t n = static_cast<std::size_t>(region.num_elements()) * item;
      buf.resize(n);
      DISTCKPT_RETURN_IF_ERROR(reader.read(source_tensor, region, buf.data(), &result->bytes_read));
      DISTCKPT_RETURN_IF_ERROR(writer.append(t, buf.data(), n));
      result->bytes += n;
      if (options.progress) options.progress(result->bytes, total, tensor.name());
    }
  }
  return Status();
}

}  // namespace

Result<ConvertResult> convert_to(const std::string& src, const std::string& dst, Format to,
                                 const ConvertOptions& options, const ConvertControl& control) {
  return internal_base::guarded("convert", [&]() -> Result<ConvertResult> {
    std::shared_ptr<FileSystem> fs = internal_storage::filesystem_for(src, options.fs);
    const internal_format::FormatDriver& format = internal_format::driver(to);
    DISTCKPT_RETURN_IF_ERROR(options.encryption.validate());
    if (options.encryption.enabled()) DISTCKPT_RETURN_IF_ERROR(internal_format::encryption_refused(to));
    DISTCKPT_ASSIGN_OR_RETURN(auto reader, CheckpointReader::open(fs, src, options.key.get()));
    const proto::Index& index = reader->index();
    DISTCKPT_RETURN_IF_ERROR(check_single_source(fs, src, index, options));
    fs = internal_storage::filesystem_for(dst, options.fs);  // from here on, the destination's
    // <root>/<name>: the destination and the directory it is committed in.
    std::string path = internal_base::trim_trailing_slashes(dst);
    const std::string ext(format.extension);
    if (!ext.empty() && !internal_base::ends_with(path, ext)) path += ext;
    const std::string root = internal_base::dir_name(path);
    const std::string name = internal_base::base_name(path);
    DISTCKPT_RETURN_IF_ERROR(internal_catalog::validate_checkpoint_name(name));
    DISTCKPT_RETURN_IF_ERROR(refuse_inside_checkpoint(*fs, path, root));
    DISTCKPT_ASSIGN_OR_RETURN(const Selection selection, select_tensors(index, options, src));
    proto::Index meta = copy_metadata(index, selection, format, control.meta_name.empty() ? name : control.meta_name);
    DISTCKPT_RETURN_IF_ERROR(internal_format::check_writable(to, meta));

    // An encrypted destination: fresh salt, so fresh keys and nonces.
    std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
    std::string salt;
    if (options.encryption.enabled() && to == Format::kNative) {  // a .ckpt is encrypted with the key itself
      DISTCKPT_ASSIGN_OR_RETURN(salt, internal_transform::CheckpointCipher::random_bytes(internal_transform::kSaltBytes));
      DISTCKPT_ASSIGN_OR_RETURN(cipher, internal_transform::CheckpointCipher::create(options.encryption.mode,
                                                                                    *options.encryption.key, salt));
    }
    if (!control.commit && !format.single_file) return unsupported("convert: a native checkpoint is always committed");
    DISTCKPT_ASSIGN_OR_RETURN(internal_catalog::Entry entry,
                              open_entry(fs, path, root, name, !format.single_file, options, control));
    meta.set_writer_version(version());
    // Reproducible: no clock and no directory state in the bytes, so equal tensors give
    // equal files.
    meta.set_commit_seq(control.reproducible ? 0 : entry.commit_seq);
    meta.set_created_unix_ms(control.reproducible ? 0 : internal_base::wall_clock_ms());
    uint64_t total = 0;
    const uint64_t budget = region_budget(index, selection, options.region_bytes, &total);

    ConvertResult result;
    result.path = path;
    std::unique_ptr<internal_format::SequentialWriter> writer;
    Status st = [&]() -> Status {
      internal_format::WriterOptions writer_options;
      writer_options.ckpt_crc_footer = options.ckpt_crc_footer;
      writer_options.cipher = cipher.get();
      writer_options.encryption = &options.encryption;
      DISTCKPT_ASSIGN_OR_RETURN(writer,
                                internal_format::make_sequential_writer(to, *fs, entry.target(), meta, writer_options));
      DISTCKPT_RETURN_IF_ERROR(copy_tensors(*reader, *writer, selection, budget, total, options, &result));
      DISTCKPT_ASSIGN_OR_RETURN(proto::Index written, writer->finish(options.fsync));
      writer.reset();
      if (!control.commit) return Status();
      if (format.single_file) return internal_catalog::finish_entry(*fs, entry, nullptr, options.fsync, false).status();
      written.set_world_size(std::max(written.world_size(), 1));
      internal_catalog::name_files_under_entry(entry, &written);  // an object root's save prefix
      if (cipher) DISTCKPT_RETURN_IF_ERROR(internal_format::seal_index(&written, *cipher, salt));
      return internal_catalog::finish_entry(*fs, entry, &written, options.fsync, false).status();
    }();
    if (!st.ok()) {
      writer.reset();
      if (fs->exists(entry.tmp)) discard_entry(*fs, entry);
      return st.with_context("convert '" + src + "' -> '" + path + "'");
    }
    if (!control.commit) {
      result.path = entry.target();
      if (control.written != nullptr) *control.written = entry;
    }
    return result;
  });
}

Status share_by_umask(const std::string& path) {
  mode_t mask = 022;
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), status) != nullptr) {
      unsigned value = 0;
      if (std::sscanf(line, "Umask: %o", &value) == 1) mask = static_cast<mode_t>(value & 0777);
    }
    std::fclose(status);
  }
  std::error_code ec;
  auto apply = [&](const std::filesystem::path& p, bool directory) -> Status {
    if (::chmod(p.c_str(), (directory ? 0777 : 0666) & ~mask) != 0)
      return io_error("export '" + p.string() + "': chmod: " + std::strerror(errno));
    return Status();
  };
  const bool directory = std::filesystem::is_directory(path, ec);
  DISTCKPT_RETURN_IF_ERROR(apply(path, directory));
  if (!directory) return Status();
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (!it->is_symlink()) DISTCKPT_RETURN_IF_ERROR(apply(it->path(), it->is_directory()));
  if (ec) return io_error("export '" + path + "': " + ec.message());
  return Status();
}

}  // namespace internal_tools

Result<ConvertResult> convert_checkpoint(const std::string& src, const std::string& dst, Format to,
                                         const ConvertOptions& options) {
  DISTCKPT_ASSIGN_OR_RETURN(ConvertResult result, internal_tools::convert_to(src, dst, to, options, {}));
  // Permissions are a file system's (an object store's access is its bucket policy's).
  if (!options.owner_only && !options.fs && !internal_storage::is_object_path(result.path))
    DISTCKPT_RETURN_IF_ERROR(internal_tools::share_by_umask(result.path));
  return result;
}

}  // namespace distckpt
