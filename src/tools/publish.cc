// publish_checkpoint: a reproducible single-file export (tools/convert.h), named by
// the SHA-256 of its bytes, committed with the single-file commit (catalog/commit.h).
#include "base/guard.h"
#include "base/strings.h"
#include "catalog/commit.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "format/format.h"
#include "tools/convert.h"
#include "storage/file_sha256.h"

namespace distckpt {

Result<PublishResult> publish_checkpoint(const std::string& src, const PublishOptions& options) {
  return internal_base::guarded("publish", [&]() -> Result<PublishResult> {
    std::shared_ptr<FileSystem> fs = options.fs ? options.fs : posix_filesystem();
    if (!internal_format::driver(options.format).single_file)
      return invalid_argument("publish: the format must be a single file (ckpt, safetensors or hdf5), not native");
    DISTCKPT_ASSIGN_OR_RETURN(std::string source, resolve_checkpoint(src, {.fs = fs, .key = options.key}));
    source = internal_base::trim_trailing_slashes(source);
    DISTCKPT_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint_info(source, {fs, options.key}));

    // <directory>/<stem>-<sha8><ext>, the stem being the source's name without extension.
    std::string stem = internal_base::base_name(source);
    const std::string source_ext(internal_format::driver(info.format).extension);
    if (!source_ext.empty() && stem.size() > source_ext.size() && internal_base::ends_with(stem, source_ext))
      stem.resize(stem.size() - source_ext.size());
    std::string directory = options.directory;
    if (directory.empty()) directory = internal_base::dir_name(source);
    const std::string ext(internal_format::driver(options.format).extension);

    ConvertOptions convert;
    convert.fsync = options.fsync;
    convert.ckpt_crc_footer = options.ckpt_crc_footer;
    convert.region_bytes = options.region_bytes;
    convert.only = options.only;
    convert.fs = fs;
    convert.key = options.key;
    internal_tools::ConvertControl control;
    control.commit = false;
    control.reproducible = true;
    control.meta_name = stem;
    internal_catalog::Entry entry;
    control.written = &entry;
    DISTCKPT_ASSIGN_OR_RETURN(ConvertResult written,
                              internal_tools::convert_to(source, directory + "/" + stem, options.format, convert,
                                                           control));
    const std::string tmp = written.path;
    // The temporary entry goes whatever happens below, exceptions included.
    struct RemoveTmp {
      FileSystem& fs;
      const internal_catalog::Entry& entry;
      ~RemoveTmp() { internal_catalog::discard_entry(fs, entry); }
    } remove_tmp{*fs, entry};
    auto result = [&]() -> Result<PublishResult> {
      PublishResult out;
      DISTCKPT_ASSIGN_OR_RETURN(out.sha256, internal_storage::sha256_file(*fs, tmp));
      const std::string name = stem + "-" + out.sha256.substr(0, 8) + ext;
      out.path = directory + "/" + name;
      for (const auto& t : info.tensors)
        (internal_tools::name_selected(t.name, options.only) ? out.tensors : out.dropped).push_back(t.name);
      {
        DISTCKPT_ASSIGN_OR_RETURN(auto file, fs->open_readable(tmp));
        DISTCKPT_ASSIGN_OR_RETURN(out.file_bytes, file->size());
      }
      // Published before (or by a concurrent publisher)? The same name with the same
      // digest is the same file.
      auto same_file_there = [&]() -> Result<bool> {
        DISTCKPT_ASSIGN_OR_RETURN(std::string there, internal_storage::sha256_file(*fs, out.path));
        if (there != out.sha256)
          return already_exists("publish: '" + out.path + "' exists with a different SHA-256 (" + there + ")");
        return true;
      };
      if (fs->exists(out.path)) {
        DISTCKPT_ASSIGN_OR_RETURN(out.already_published, same_file_there());
        return out;
      }
      auto committed = internal_catalog::install_checkpoint(*fs, directory, tmp, name, options.fsync,
                                                            {.update = false, .commit_seq = 0, .before_rename = nullptr});
      if (!committed.ok() && committed.status().code() == StatusCode::kAlreadyExists && fs->exists(out.path)) {
        DISTCKPT_ASSIGN_OR_RETURN(out.already_published, same_file_there());
        return out;
      }
      DISTCKPT_RETURN_IF_ERROR(committed.status());  // a warning only says the entry may not be durable yet
      if (!options.owner_only && !options.fs) DISTCKPT_RETURN_IF_ERROR(internal_tools::share_by_umask(out.path));
      return out;
    }();
    if (!result.ok()) return result.status().with_context("publish '" + source + "'");
    return result;
  });
}

}  // namespace distckpt
