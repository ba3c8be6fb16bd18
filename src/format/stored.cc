#include "format/stored.h"

#include "base/strings.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/format.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_format {

Result<proto::Index> read_stored_index(FileSystem& fs, const std::string& path) {
  const FormatDriver* d = detect(fs, path);
  // Neither a directory with an index nor a file any format recognises: the native
  // reader says what is missing.
  if (d == nullptr || !d->single_file) return native_driver().describe(fs, path);
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, d->describe(fs, path));
  if (index.name().empty()) index.set_name(internal_base::base_name(path));
  DISTCKPT_RETURN_IF_ERROR(validate_index(index, path));
  return index;
}

Result<proto::Index> read_stored_summary(FileSystem& fs, const std::string& path) {
  const FormatDriver* d = detect(fs, path);
  if (d != nullptr && d->id == Format::kCkpt) {
    DISTCKPT_ASSIGN_OR_RETURN(std::optional<proto::Index> summary, describe_framed_ckpt_summary(fs, path));
    if (summary) {
      if (summary->name().empty()) summary->set_name(internal_base::base_name(path));
      DISTCKPT_RETURN_IF_ERROR(validate_index(*summary, path));
      return *std::move(summary);
    }
  }
  return read_stored_index(fs, path);
}

}  // namespace distckpt::internal_format
