#include "collective/fetch_index.h"

#include "base/guard.h"
#include "comm/agree.h"
#include "distckpt/catalog.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/stored.h"

namespace distckpt::internal_collective {

Result<FetchedIndex> fetch_index(Comm& comm, const std::shared_ptr<FileSystem>& fs, const std::string& path,
                                 const std::string& where) {
  FetchedIndex out;
  std::string index_bytes;
  Status local;
  if (comm.rank() == 0) {
    local = internal_base::guarded(where, [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(out.path, resolve_checkpoint(path, {.fs = fs}));
      const internal_format::FormatDriver* format = internal_format::detect(*fs, out.path);
      if (format != nullptr && format->single_file) {
        // A single file: rank 0 reads its structure and describes it as an index.
        DISTCKPT_ASSIGN_OR_RETURN(proto::Index described, internal_format::read_stored_index(*fs, out.path));
        described.SerializeToString(&index_bytes);
        return Status();
      }
      // The header is checked against the file's size before the rest is read, so what
      // is broadcast is bounded by a real file; every rank then validates it alike.
      DISTCKPT_ASSIGN_OR_RETURN(index_bytes, internal_format::read_index_bytes(*fs, out.path));
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, local.with_context(where)));
  comm.broadcast_string(out.path, 0);
  comm.broadcast_string(index_bytes, 0);
  local = internal_base::guarded(where, [&]() -> Status {
    if (internal_format::is_framed_index(index_bytes)) {
      DISTCKPT_ASSIGN_OR_RETURN(out.index,
                                internal_format::parse_index(index_bytes, out.path + "/" + internal_format::kIndexFileName));
      return Status();
    }
    if (!out.index.ParseFromString(index_bytes)) return internal_error("the description of '" + out.path + "' does not parse");
    return internal_format::validate_index(out.index, out.path);
  });
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, local.with_context(where)));
  return out;
}

}  // namespace distckpt::internal_collective
