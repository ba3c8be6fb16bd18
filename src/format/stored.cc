#include "format/stored.h"

#include "base/strings.h"
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

}  // namespace distckpt::internal_format
