// remove_local (tier.h): the record first, then every node's files (kept as spares when
// the tier recycles them).
#include "base/guard.h"
#include "catalog/names.h"
#include "comm/agree.h"
#include "distckpt/tier.h"
#include "storage/spare_files.h"
#include "storage/write_maps.h"
#include "tier/nodes.h"
#include "tier/record.h"

namespace distckpt {

Status remove_local(Comm& comm, const std::string& root, const LocalTier& tier, const std::string& name,
                    std::shared_ptr<FileSystem> fs) {
  using namespace internal_tier;
  if (!fs) fs = posix_filesystem();
  const std::string where = "remove_local: rank " + std::to_string(comm.rank());
  Status local = internal_catalog::validate_checkpoint_name(name).with_context(where);
  if (local.ok() && comm.rank() == 0)
    local = internal_base::guarded(where, [&]() -> Status {
      const std::string record = record_path(root, name);
      if (!fs->exists(record)) return not_found("no local checkpoint '" + name + "' in '" + root + "'");
      return fs->remove_file(record);
    });
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(comm, local));
  const NodeMap nodes = node_map(comm);
  if (nodes.leader(nodes.node_of[static_cast<std::size_t>(comm.rank())]) == comm.rank()) {
    const std::string dir = node_dir(comm, tier.dir, comm.rank());
    // Unlisted already: what is left on a node is garbage, removed as well as we can.
    if (fs->exists(dir + "/" + name)) (void)remove_node_entry(*fs, dir, name, tier.recycle);
  }
  comm.barrier();  // the files are gone (or spares) on every node when this returns
  internal_storage::prune_write_mappings();  // a removed file's pages go back now
  return Status();
}

void release_local_spares(Comm& comm, const LocalTier& tier, std::shared_ptr<FileSystem> fs) {
  using namespace internal_tier;
  if (!fs) fs = posix_filesystem();
  const NodeMap nodes = node_map(comm);
  if (nodes.leader(nodes.node_of[static_cast<std::size_t>(comm.rank())]) == comm.rank())
    internal_storage::drop_spares(*fs, spare_dir(node_dir(comm, tier.dir, comm.rank())));
  comm.barrier();
  internal_storage::prune_write_mappings();
}

}  // namespace distckpt
